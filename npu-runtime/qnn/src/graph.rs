//! Safe wrappers over QNN contexts and graphs: build (tensors, nodes with parameters),
//! finalize, execute, serialise to a context binary and load from one.
//!
//! Ownership: a [`Context`] owns its graphs (QNN frees graphs with their context). A
//! [`Graph`] keeps the description of its application tensors (ids, shapes, types), which
//! is all execution needs — execution matches tensors by id — so the same description is
//! stored next to a context binary and reused after loading it.

use crate::error::{QnnError, QnnResult};
use crate::ffi::{self, Handle};
use crate::library::{check, runtime, with_stdout_silenced, QnnRuntime};
use std::ffi::{c_void, CString};

/// Element types we use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F16,
    F32,
    I32,
    U32,
    /// Unsigned 8-bit fixed point (quantized, see [`Quant`]).
    U8,
    /// Signed 8-bit fixed point.
    S8,
}

impl DType {
    pub fn qnn(self) -> u32 {
        match self {
            DType::F16 => ffi::DATATYPE_FLOAT_16,
            DType::F32 => ffi::DATATYPE_FLOAT_32,
            DType::I32 => ffi::DATATYPE_INT_32,
            DType::U32 => ffi::DATATYPE_UINT_32,
            DType::U8 => ffi::DATATYPE_UFIXED_POINT_8,
            DType::S8 => ffi::DATATYPE_SFIXED_POINT_8,
        }
    }

    pub fn size(self) -> usize {
        match self {
            DType::F16 => 2,
            DType::U8 | DType::S8 => 1,
            _ => 4,
        }
    }

    pub fn code(self) -> u8 {
        match self {
            DType::F16 => 0,
            DType::F32 => 1,
            DType::I32 => 2,
            DType::U32 => 3,
            DType::U8 => 4,
            DType::S8 => 5,
        }
    }

    pub fn from_code(c: u8) -> Option<DType> {
        [
            DType::F16,
            DType::F32,
            DType::I32,
            DType::U32,
            DType::U8,
            DType::S8,
        ]
        .get(c as usize)
        .copied()
    }
}

/// `Qnn_Precision_t` for the HTP graph precision setting: with `Float16` the HTP runs
/// fp32 graph tensors in fp16.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    Float32,
    Float16,
}

/// How the block lowering stores the weight matrices (the FullyConnected weights: Q/K/V,
/// output projection, MLP, LM head; the embedding table stays fp16 for `Gather`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    #[default]
    F16,
    /// Symmetric s8 with one scale per output channel (offset 0): the only 8-bit weight
    /// form this HTP build computes correctly with fp16 activations (tests/qnn_quant.rs).
    S8PerChannel,
}

/// HTP graph settings passed to `graphCreate` (`None`: the library's default), and the
/// lowering's weight format (`weights`, not a `graphCreate` setting).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GraphOptions {
    pub precision: Option<Precision>,
    /// Finalize optimization level, 1 (fast prepare) ..= 3.
    pub optimization: Option<u8>,
    pub weights: WeightFormat,
}

/// Quantization of a fixed-point static tensor: real = (stored + offset) * scale.
#[derive(Clone, Debug, PartialEq)]
pub enum Quant {
    PerTensor {
        scale: f32,
        offset: i32,
    },
    /// One (scale, offset) per index along `axis` (e.g. per output channel).
    PerAxis {
        axis: i32,
        scale_offsets: Vec<(f32, i32)>,
    },
}

/// An application input or output of a finalized graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoTensor {
    pub id: u32,
    pub name: String,
    pub dims: Vec<u32>,
    pub dtype: DType,
}

impl IoTensor {
    pub fn bytes(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product::<usize>() * self.dtype.size()
    }
}

/// A QNN context on the process-wide HTP device. Freed on drop.
pub struct Context {
    rt: &'static QnnRuntime,
    handle: Handle,
}

// SAFETY: the context handle is only used under the runtime lock (shared only for
// load/retrieve/free of this context, which `&mut`/ownership keeps to one thread).
unsafe impl Send for Context {}

impl Context {
    pub fn new() -> QnnResult<Context> {
        let rt = runtime()?;
        let f = rt
            .table()
            .context_create
            .ok_or_else(|| missing("contextCreate"))?;
        let mut handle: Handle = std::ptr::null_mut();
        let _g = rt.lock();
        // SAFETY: valid backend/device handles, null config, out-pointer.
        check("contextCreate", unsafe {
            f(rt.backend(), rt.device(), std::ptr::null(), &mut handle)
        })?;
        Ok(Context { rt, handle })
    }

    /// Recreates a context (with its finalized graphs) from a serialized binary.
    pub fn from_binary(bytes: &[u8]) -> QnnResult<Context> {
        let rt = runtime()?;
        let f = rt
            .table()
            .context_create_from_binary
            .ok_or_else(|| missing("contextCreateFromBinary"))?;
        let mut handle: Handle = std::ptr::null_mut();
        let _g = rt.shared();
        // SAFETY: `bytes` is valid for its length during the call (QNN copies what it
        // keeps); null config and profile; out-pointer.
        check("contextCreateFromBinary", unsafe {
            f(
                rt.backend(),
                rt.device(),
                std::ptr::null(),
                bytes.as_ptr() as *const c_void,
                bytes.len() as ffi::BinarySize,
                &mut handle,
                std::ptr::null_mut(),
            )
        })?;
        Ok(Context { rt, handle })
    }

    /// Serializes the context (all its finalized graphs).
    pub fn binary(&self) -> QnnResult<Vec<u8>> {
        let t = self.rt.table();
        let size_f = t
            .context_get_binary_size
            .ok_or_else(|| missing("contextGetBinarySize"))?;
        let get_f = t
            .context_get_binary
            .ok_or_else(|| missing("contextGetBinary"))?;
        let _g = self.rt.lock();
        let mut size: ffi::BinarySize = 0;
        // SAFETY: valid context, out-pointer.
        check("contextGetBinarySize", unsafe {
            size_f(self.handle, &mut size)
        })?;
        let mut buf = vec![0u8; size as usize];
        let mut written: ffi::BinarySize = 0;
        // SAFETY: `buf` is writable for `size` bytes.
        check("contextGetBinary", unsafe {
            get_f(
                self.handle,
                buf.as_mut_ptr() as *mut c_void,
                size,
                &mut written,
            )
        })?;
        if written > size {
            return Err(QnnError::Invalid(format!(
                "binary of {written} > {size} bytes"
            )));
        }
        buf.truncate(written as usize);
        Ok(buf)
    }

    /// Starts a new graph in this context with the library's default graph settings.
    pub fn build(&self, name: &str) -> QnnResult<GraphBuilder<'_>> {
        self.build_with(name, GraphOptions::default())
    }

    /// Starts a new graph with HTP graph settings (precision, finalize optimization).
    pub fn build_with(&self, name: &str, opts: GraphOptions) -> QnnResult<GraphBuilder<'_>> {
        let f = self
            .rt
            .table()
            .graph_create
            .ok_or_else(|| missing("graphCreate"))?;
        let cname = cstring(name)?;
        let mut customs = Vec::new();
        if let Some(p) = opts.precision {
            customs.push(ffi::HtpGraphCustomConfig {
                option: ffi::HTP_GRAPH_CONFIG_OPTION_PRECISION,
                payload: ffi::HtpGraphPayload {
                    precision: match p {
                        Precision::Float32 => ffi::PRECISION_FLOAT32,
                        Precision::Float16 => ffi::PRECISION_FLOAT16,
                    },
                },
            });
        }
        if let Some(level) = opts.optimization {
            customs.push(ffi::HtpGraphCustomConfig {
                option: ffi::HTP_GRAPH_CONFIG_OPTION_OPTIMIZATION,
                payload: ffi::HtpGraphPayload {
                    optimization: ffi::HtpOptimization {
                        kind: ffi::HTP_GRAPH_OPTIMIZATION_FINALIZE_FLAG,
                        value: f32::from(level),
                    },
                },
            });
        }
        let configs: Vec<ffi::GraphConfig> = customs
            .iter()
            .map(|c| ffi::GraphConfig {
                option: ffi::GRAPH_CONFIG_OPTION_CUSTOM,
                custom: c as *const _ as *const c_void,
            })
            .collect();
        let mut list: Vec<*const c_void> = configs
            .iter()
            .map(|c| c as *const _ as *const c_void)
            .collect();
        list.push(std::ptr::null());
        let cfg = if configs.is_empty() {
            std::ptr::null()
        } else {
            list.as_ptr()
        };
        let mut handle: Handle = std::ptr::null_mut();
        let _g = self.rt.lock();
        // SAFETY: valid context, NUL-terminated name, a null-terminated config list (or
        // null) whose entries point into `configs`/`customs`, alive for the call;
        // out-pointer.
        check(
            "graphCreate",
            with_stdout_silenced(|| unsafe { f(self.handle, cname.as_ptr(), cfg, &mut handle) }),
        )?;
        Ok(GraphBuilder {
            ctx: self,
            handle,
            name: name.to_string(),
            tensors: Vec::new(),
            statics: Vec::new(),
            scale_offsets: Vec::new(),
            n_nodes: 0,
        })
    }

    /// A finalized graph of this context (after [`Context::from_binary`]) with the I/O
    /// description stored next to the binary.
    pub fn graph(
        &self,
        name: &str,
        inputs: Vec<IoTensor>,
        outputs: Vec<IoTensor>,
    ) -> QnnResult<Graph> {
        let f = self
            .rt
            .table()
            .graph_retrieve
            .ok_or_else(|| missing("graphRetrieve"))?;
        let cname = cstring(name)?;
        let mut handle: Handle = std::ptr::null_mut();
        let _g = self.rt.shared();
        // SAFETY: valid context, NUL-terminated name, out-pointer.
        check("graphRetrieve", unsafe {
            f(self.handle, cname.as_ptr(), &mut handle)
        })?;
        Ok(Graph::new(self.rt, handle, name, inputs, outputs))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Some(f) = self.rt.table().context_free {
            let _g = self.rt.shared();
            // SAFETY: the handle came from contextCreate[FromBinary] and is freed once.
            unsafe { f(self.handle, std::ptr::null_mut()) };
        }
    }
}

/// A tensor of a graph under construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorId(usize);

struct TensorDesc {
    id: u32,
    name: CString,
    dims: Vec<u32>,
    dtype: DType,
    kind: u32,
    /// Index into `GraphBuilder::statics` for constants.
    data: Option<usize>,
    /// Points into `GraphBuilder::scale_offsets` for per-axis quantization.
    quant: ffi::QuantizeParams,
}

/// A node parameter.
pub enum Param<'a> {
    Scalar(&'a str, ffi::Scalar),
    /// A static tensor parameter (e.g. axes, perm, begin/end ranges).
    Tensor(&'a str, DType, Vec<u32>, Vec<u8>),
}

impl Param<'_> {
    pub fn u32s<'a>(name: &'a str, v: &[u32]) -> Param<'a> {
        Param::Tensor(
            name,
            DType::U32,
            vec![v.len() as u32],
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }

    /// A `[n, 3]` (begin, end, stride) range table for StridedSlice.
    pub fn ranges<'a>(name: &'a str, r: &[[i32; 3]]) -> Param<'a> {
        Param::Tensor(
            name,
            DType::I32,
            vec![r.len() as u32, 3],
            r.iter().flatten().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }
}

/// Builds one graph: create tensors, add nodes, then [`GraphBuilder::finalize`].
pub struct GraphBuilder<'c> {
    ctx: &'c Context,
    handle: Handle,
    name: String,
    tensors: Vec<TensorDesc>,
    /// Static data must stay valid until finalize.
    statics: Vec<Vec<u8>>,
    /// Per-axis quantization tables, referenced by tensor descriptions until finalize.
    scale_offsets: Vec<Vec<ffi::ScaleOffset>>,
    n_nodes: usize,
}

impl GraphBuilder<'_> {
    fn create(
        &mut self,
        kind: u32,
        dtype: DType,
        dims: &[u32],
        data: Option<Vec<u8>>,
        quant: Option<&Quant>,
    ) -> QnnResult<TensorId> {
        let n = self.tensors.len();
        let name = cstring(&format!("t{n}"))?;
        let mut dims = dims.to_vec();
        let mut t = ffi::empty_tensor();
        t.v1.name = name.as_ptr();
        t.v1.tensor_type = kind;
        t.v1.data_type = dtype.qnn();
        t.v1.rank = dims.len() as u32;
        t.v1.dimensions = dims.as_mut_ptr();
        t.v1.quantize_params = match quant {
            None => ffi::QuantizeParams::NONE,
            Some(Quant::PerTensor { scale, offset }) => {
                ffi::QuantizeParams::scale_offset(*scale, *offset)
            }
            Some(Quant::PerAxis {
                axis,
                scale_offsets,
            }) => {
                let so: Vec<ffi::ScaleOffset> = scale_offsets
                    .iter()
                    .map(|&(scale, offset)| ffi::ScaleOffset { scale, offset })
                    .collect();
                // The inner buffer does not move when the outer Vec grows.
                self.scale_offsets.push(so);
                let so = self.scale_offsets.last().expect("just pushed");
                ffi::QuantizeParams::axis_scale_offset(*axis, so)
            }
        };
        let has_data = data.is_some();
        if let Some(d) = data {
            let want = dims.iter().map(|&x| x as usize).product::<usize>() * dtype.size();
            if d.len() != want {
                return Err(QnnError::Invalid(format!(
                    "static tensor {n}: {} bytes for dims {dims:?}",
                    d.len()
                )));
            }
            self.statics.push(d);
            let d = self.statics.last_mut().expect("just pushed");
            t.v1.client_buf = ffi::ClientBuffer {
                data: d.as_mut_ptr() as *mut c_void,
                data_size: d.len() as u32,
            };
        }
        let f = self
            .ctx
            .rt
            .table()
            .tensor_create_graph_tensor
            .ok_or_else(|| missing("tensorCreateGraphTensor"))?;
        {
            let _g = self.ctx.rt.lock();
            // SAFETY: `t` points at our name, dims and (static) data, all alive for the
            // call; static data stays alive in `self.statics` until finalize.
            check("tensorCreateGraphTensor", unsafe { f(self.handle, &mut t) })?;
        }
        self.tensors.push(TensorDesc {
            id: t.v1.id,
            name,
            dims,
            dtype,
            kind,
            data: has_data.then(|| self.statics.len() - 1),
            quant: t.v1.quantize_params,
        });
        Ok(TensorId(n))
    }

    /// An application-written input.
    pub fn input(&mut self, dtype: DType, dims: &[u32]) -> QnnResult<TensorId> {
        self.create(ffi::TENSOR_TYPE_APP_WRITE, dtype, dims, None, None)
    }

    /// An application-read output.
    pub fn output(&mut self, dtype: DType, dims: &[u32]) -> QnnResult<TensorId> {
        self.create(ffi::TENSOR_TYPE_APP_READ, dtype, dims, None, None)
    }

    /// An intermediate tensor.
    pub fn native(&mut self, dtype: DType, dims: &[u32]) -> QnnResult<TensorId> {
        self.create(ffi::TENSOR_TYPE_NATIVE, dtype, dims, None, None)
    }

    /// A constant (weights) with its little-endian bytes.
    pub fn constant(&mut self, dtype: DType, dims: &[u32], data: Vec<u8>) -> QnnResult<TensorId> {
        self.create(ffi::TENSOR_TYPE_STATIC, dtype, dims, Some(data), None)
    }

    /// A fixed-point constant (`DType::U8`/`S8`) with its quantization.
    pub fn constant_quantized(
        &mut self,
        dtype: DType,
        dims: &[u32],
        data: Vec<u8>,
        quant: &Quant,
    ) -> QnnResult<TensorId> {
        if !matches!(dtype, DType::U8 | DType::S8) {
            return Err(QnnError::Invalid(format!(
                "quantized constant of type {dtype:?}"
            )));
        }
        if let Quant::PerAxis {
            axis,
            scale_offsets,
        } = quant
        {
            let ok = usize::try_from(*axis)
                .ok()
                .and_then(|a| dims.get(a))
                .is_some_and(|&n| n as usize == scale_offsets.len());
            if !ok {
                return Err(QnnError::Invalid(format!(
                    "{} scale/offsets for axis {axis} of {dims:?}",
                    scale_offsets.len()
                )));
            }
        }
        self.create(
            ffi::TENSOR_TYPE_STATIC,
            dtype,
            dims,
            Some(data),
            Some(quant),
        )
    }

    pub fn dims(&self, t: TensorId) -> &[u32] {
        &self.tensors[t.0].dims
    }

    pub fn dtype(&self, t: TensorId) -> DType {
        self.tensors[t.0].dtype
    }

    fn raw(&self, t: TensorId) -> ffi::Tensor {
        let d = &self.tensors[t.0];
        let mut r = ffi::empty_tensor();
        r.v1.id = d.id;
        r.v1.name = d.name.as_ptr();
        r.v1.tensor_type = d.kind;
        r.v1.data_type = d.dtype.qnn();
        r.v1.rank = d.dims.len() as u32;
        r.v1.dimensions = d.dims.as_ptr() as *mut u32;
        r.v1.quantize_params = d.quant;
        if let Some(i) = d.data {
            let buf = &self.statics[i];
            r.v1.client_buf = ffi::ClientBuffer {
                data: buf.as_ptr() as *mut c_void,
                data_size: buf.len() as u32,
            };
        }
        r
    }

    /// Adds a node of QNN op `op` (package "qti.aisw"), validating it with the backend first
    /// so an unsupported configuration fails here with its error code.
    pub fn node(
        &mut self,
        op: &str,
        inputs: &[TensorId],
        outputs: &[TensorId],
        params: Vec<Param<'_>>,
    ) -> QnnResult<()> {
        let mut names = Vec::with_capacity(params.len());
        let mut raw_params = Vec::with_capacity(params.len());
        for p in params {
            match p {
                Param::Scalar(name, s) => {
                    names.push(cstring(name)?);
                    raw_params.push(ffi::Param {
                        param_type: ffi::PARAMTYPE_SCALAR,
                        name: std::ptr::null(),
                        value: ffi::ParamValue { scalar: s },
                    });
                }
                Param::Tensor(name, dtype, dims, data) => {
                    let t = self.constant(dtype, &dims, data)?;
                    names.push(cstring(name)?);
                    raw_params.push(ffi::Param {
                        param_type: ffi::PARAMTYPE_TENSOR,
                        name: std::ptr::null(),
                        value: ffi::ParamValue {
                            tensor: self.raw(t),
                        },
                    });
                }
            }
        }
        for (p, n) in raw_params.iter_mut().zip(&names) {
            p.name = n.as_ptr();
        }
        let mut ins: Vec<ffi::Tensor> = inputs.iter().map(|&t| self.raw(t)).collect();
        let mut outs: Vec<ffi::Tensor> = outputs.iter().map(|&t| self.raw(t)).collect();
        let node_name = cstring(&format!("n{}_{op}", self.n_nodes))?;
        let type_name = cstring(op)?;
        let package = cstring("qti.aisw")?;
        let cfg = ffi::OpConfig {
            version: ffi::OPCONFIG_VERSION_1,
            v1: ffi::OpConfigV1 {
                name: node_name.as_ptr(),
                package_name: package.as_ptr(),
                type_name: type_name.as_ptr(),
                num_params: raw_params.len() as u32,
                params: raw_params.as_mut_ptr(),
                num_inputs: ins.len() as u32,
                inputs: ins.as_mut_ptr(),
                num_outputs: outs.len() as u32,
                outputs: outs.as_mut_ptr(),
            },
        };
        let t = self.ctx.rt.table();
        let validate = t
            .backend_validate_op_config
            .ok_or_else(|| missing("backendValidateOpConfig"))?;
        let add = t.graph_add_node.ok_or_else(|| missing("graphAddNode"))?;
        let _g = self.ctx.rt.lock();
        // SAFETY: every pointer in `cfg` refers to locals or to `self` data alive for both
        // calls; the config is passed by value as the API declares.
        // The library logs rejections to stdout; the error below carries the code.
        let code = with_stdout_silenced(|| unsafe { validate(self.ctx.rt.backend(), cfg) });
        if code != ffi::SUCCESS {
            return Err(QnnError::Invalid(format!(
                "backend rejects {op} (inputs {:?}, outputs {:?}): error {code}",
                inputs
                    .iter()
                    .map(|&i| self.dims(i).to_vec())
                    .collect::<Vec<_>>(),
                outputs
                    .iter()
                    .map(|&i| self.dims(i).to_vec())
                    .collect::<Vec<_>>()
            )));
        }
        // SAFETY: as above.
        check("graphAddNode", unsafe { add(self.handle, cfg) })?;
        self.n_nodes += 1;
        Ok(())
    }

    fn io(&self, kind: u32) -> Vec<IoTensor> {
        self.tensors
            .iter()
            .filter(|t| t.kind == kind)
            .map(|t| IoTensor {
                id: t.id,
                name: t.name.to_string_lossy().into_owned(),
                dims: t.dims.clone(),
                dtype: t.dtype,
            })
            .collect()
    }

    /// Compiles the graph for the HTP. Inputs and outputs keep their creation order.
    pub fn finalize(self) -> QnnResult<Graph> {
        let f = self
            .ctx
            .rt
            .table()
            .graph_finalize
            .ok_or_else(|| missing("graphFinalize"))?;
        {
            let _g = self.ctx.rt.lock();
            // SAFETY: valid graph handle; null profile and signal.
            check("graphFinalize", unsafe {
                f(self.handle, std::ptr::null_mut(), std::ptr::null_mut())
            })?;
        }
        let inputs = self.io(ffi::TENSOR_TYPE_APP_WRITE);
        let outputs = self.io(ffi::TENSOR_TYPE_APP_READ);
        Ok(Graph::new(
            self.ctx.rt,
            self.handle,
            &self.name,
            inputs,
            outputs,
        ))
    }
}

/// A finalized graph. Valid while its [`Context`] lives (the owner keeps both together).
pub struct Graph {
    rt: &'static QnnRuntime,
    handle: Handle,
    name: String,
    inputs: Vec<IoTensor>,
    outputs: Vec<IoTensor>,
    names: Vec<CString>,
    in_raw: Vec<ffi::Tensor>,
    out_raw: Vec<ffi::Tensor>,
}

// SAFETY: the graph handle is only used under the runtime lock (shared for execute,
// which takes `&mut self`, so one graph never runs on two threads).
unsafe impl Send for Graph {}

impl Graph {
    fn new(
        rt: &'static QnnRuntime,
        handle: Handle,
        name: &str,
        inputs: Vec<IoTensor>,
        outputs: Vec<IoTensor>,
    ) -> Graph {
        let names: Vec<CString> = inputs
            .iter()
            .chain(&outputs)
            .map(|t| CString::new(t.name.clone()).unwrap_or_default())
            .collect();
        let raw = |t: &IoTensor, kind: u32, name: &CString| {
            let mut r = ffi::empty_tensor();
            r.v1.id = t.id;
            r.v1.name = name.as_ptr();
            r.v1.tensor_type = kind;
            r.v1.data_type = t.dtype.qnn();
            r.v1.rank = t.dims.len() as u32;
            r.v1.dimensions = t.dims.as_ptr() as *mut u32;
            r
        };
        let in_raw = inputs
            .iter()
            .zip(&names)
            .map(|(t, n)| raw(t, ffi::TENSOR_TYPE_APP_WRITE, n))
            .collect();
        let out_raw = outputs
            .iter()
            .zip(&names[inputs.len()..])
            .map(|(t, n)| raw(t, ffi::TENSOR_TYPE_APP_READ, n))
            .collect();
        Graph {
            rt,
            handle,
            name: name.to_string(),
            inputs,
            outputs,
            names,
            in_raw,
            out_raw,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn inputs(&self) -> &[IoTensor] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[IoTensor] {
        &self.outputs
    }

    /// Runs the graph: `inputs[i]` / `outputs[i]` hold the raw little-endian bytes of the
    /// i-th input / output in creation order, each exactly [`IoTensor::bytes`] long.
    pub fn execute<I: AsRef<[u8]>, O: AsMut<[u8]>>(
        &mut self,
        inputs: &[I],
        outputs: &mut [O],
    ) -> QnnResult<()> {
        if inputs.len() != self.inputs.len() || outputs.len() != self.outputs.len() {
            return Err(QnnError::Invalid(format!(
                "graph {} takes {} inputs and {} outputs, got {} and {}",
                self.name,
                self.inputs.len(),
                self.outputs.len(),
                inputs.len(),
                outputs.len()
            )));
        }
        for (i, (d, b)) in self.inputs.iter().zip(inputs).enumerate() {
            let b = b.as_ref();
            if b.len() != d.bytes() {
                return Err(QnnError::Invalid(format!(
                    "input {i}: {} bytes, need {}",
                    b.len(),
                    d.bytes()
                )));
            }
            self.in_raw[i].v1.client_buf = ffi::ClientBuffer {
                data: b.as_ptr() as *mut c_void,
                data_size: b.len() as u32,
            };
        }
        for (i, (d, b)) in self.outputs.iter().zip(outputs.iter_mut()).enumerate() {
            let b = b.as_mut();
            if b.len() != d.bytes() {
                return Err(QnnError::Invalid(format!(
                    "output {i}: {} bytes, need {}",
                    b.len(),
                    d.bytes()
                )));
            }
            self.out_raw[i].v1.client_buf = ffi::ClientBuffer {
                data: b.as_mut_ptr() as *mut c_void,
                data_size: b.len() as u32,
            };
        }
        let f = self
            .rt
            .table()
            .graph_execute
            .ok_or_else(|| missing("graphExecute"))?;
        let _ = &self.names;
        let _g = self.rt.shared();
        // SAFETY: the tensor arrays point at our names/dims and at the caller's buffers,
        // whose sizes were checked above; QNN only reads inputs and writes outputs during
        // the call.
        let r = check("graphExecute", unsafe {
            f(
                self.handle,
                self.in_raw.as_ptr(),
                self.in_raw.len() as u32,
                self.out_raw.as_mut_ptr(),
                self.out_raw.len() as u32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        });
        for t in self.in_raw.iter_mut().chain(self.out_raw.iter_mut()) {
            t.v1.client_buf = ffi::ClientBuffer {
                data: std::ptr::null_mut(),
                data_size: 0,
            };
        }
        r
    }
}

fn missing(what: &str) -> QnnError {
    QnnError::Invalid(format!("the library's function table has no {what}"))
}

fn cstring(s: &str) -> QnnResult<CString> {
    CString::new(s).map_err(|_| QnnError::Invalid(format!("name with NUL: {s:?}")))
}
