//! Our own `#[repr(C)]` declarations of the subset of the QNN C API we call, written from
//! the public documentation of the API's types (core API 2.x). Nothing here is generated
//! from Qualcomm headers. Layouts are checked by the unit tests below and the function
//! table is checked at run time (see `library.rs`), because a mismatch is silent memory
//! corruption.

#![allow(dead_code)]

use std::ffi::{c_char, c_void};

/// Every QNN call returns this; the error code is in the low 16 bits.
pub type ErrorHandle = u64;
/// Opaque handles (backend, device, context, graph, log, profile, signal).
pub type Handle = *mut c_void;
/// Size of a context binary (64-bit in the 2.3x/2.4x API; a u32 in very old ones).
pub type BinarySize = u64;

pub const SUCCESS: ErrorHandle = 0;

/// The backend id the HTP library reports.
pub const BACKEND_ID_HTP: u32 = 6;

// Data types.
pub const DATATYPE_INT_32: u32 = 0x0032;
pub const DATATYPE_UINT_32: u32 = 0x0132;
pub const DATATYPE_FLOAT_16: u32 = 0x0216;
pub const DATATYPE_FLOAT_32: u32 = 0x0232;
pub const DATATYPE_BOOL_8: u32 = 0x0508;
pub const DATATYPE_SFIXED_POINT_8: u32 = 0x0308;
pub const DATATYPE_UFIXED_POINT_8: u32 = 0x0408;
pub const DATATYPE_UNDEFINED: u32 = 0x7FFF_FFFF;

// Tensor types.
pub const TENSOR_TYPE_APP_WRITE: u32 = 0;
pub const TENSOR_TYPE_APP_READ: u32 = 1;
pub const TENSOR_TYPE_NATIVE: u32 = 3;
pub const TENSOR_TYPE_STATIC: u32 = 4;

pub const TENSOR_VERSION_1: u32 = 1;
pub const TENSOR_DATA_FORMAT_DENSE: u32 = 0;
pub const TENSORMEMTYPE_RAW: u32 = 0;
pub const DEFINITION_UNDEFINED: u32 = 0x7FFF_FFFF;
pub const QUANTIZATION_ENCODING_UNDEFINED: u32 = 0x7FFF_FFFF;
pub const DEFINITION_DEFINED: u32 = 1;
pub const QUANTIZATION_ENCODING_SCALE_OFFSET: u32 = 0;
pub const QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET: u32 = 1;

pub const PARAMTYPE_SCALAR: u32 = 0;
pub const PARAMTYPE_TENSOR: u32 = 1;

pub const OPCONFIG_VERSION_1: u32 = 1;

/// `QnnDevice_Config_t.option` for a backend-specific config.
pub const DEVICE_CONFIG_OPTION_CUSTOM: u32 = 0;
/// HTP device custom option selecting the SoC model.
pub const HTP_DEVICE_CONFIG_OPTION_SOC: u32 = 0;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApiVersion {
    pub core: Version,
    pub backend: Version,
}

/// Quantization parameters. The encoding union is kept opaque (its largest member is 32
/// bytes, pointer-aligned); the constructors below fill the two members we use:
/// scale-offset (`f32 scale, i32 offset`) and axis-scale-offset (`i32 axis, u32 count`,
/// then a pointer to `count` [`ScaleOffset`]s). Real value = (stored + offset) * scale.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QuantizeParams {
    pub encoding_definition: u32,
    pub quantization_encoding: u32,
    pub encoding: [u64; 4],
}

impl QuantizeParams {
    pub const NONE: QuantizeParams = QuantizeParams {
        encoding_definition: DEFINITION_UNDEFINED,
        quantization_encoding: QUANTIZATION_ENCODING_UNDEFINED,
        encoding: [0; 4],
    };

    /// One scale and offset for the whole tensor.
    pub fn scale_offset(scale: f32, offset: i32) -> QuantizeParams {
        QuantizeParams {
            encoding_definition: DEFINITION_DEFINED,
            quantization_encoding: QUANTIZATION_ENCODING_SCALE_OFFSET,
            encoding: [
                u64::from(scale.to_bits()) | (u64::from(offset as u32) << 32),
                0,
                0,
                0,
            ],
        }
    }

    /// One scale and offset per index of `axis`; `so` must outlive every use of the result.
    pub fn axis_scale_offset(axis: i32, so: &[ScaleOffset]) -> QuantizeParams {
        QuantizeParams {
            encoding_definition: DEFINITION_DEFINED,
            quantization_encoding: QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET,
            encoding: [
                u64::from(axis as u32) | ((so.len() as u64) << 32),
                so.as_ptr() as u64,
                0,
                0,
            ],
        }
    }
}

/// `Qnn_ScaleOffset_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaleOffset {
    pub scale: f32,
    pub offset: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ClientBuffer {
    pub data: *mut c_void,
    pub data_size: u32,
}

/// Version-1 tensor description.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TensorV1 {
    pub id: u32,
    pub name: *const c_char,
    pub tensor_type: u32,
    pub data_format: u32,
    pub data_type: u32,
    pub quantize_params: QuantizeParams,
    pub rank: u32,
    pub dimensions: *mut u32,
    pub mem_type: u32,
    pub client_buf: ClientBuffer,
}

/// `Qnn_Tensor_t`: a version tag and a union of the v1 and v2 layouts. We fill v1 but the
/// union must have the v2 size (arrays of tensors are passed to execute), so the v2 tail
/// (dynamic-dimension pointer, sparse params, produced flag) is reserved here.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Tensor {
    pub version: u32,
    pub v1: TensorV1,
    /// v2 tail: `uint8_t* isDynamicDimensions; Qnn_SparseParams_t (12 bytes); uint8_t isProduced`.
    pub v2_tail: [u64; 3],
}

/// `Qnn_Scalar_t`: a data type and an 8-byte value union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Scalar {
    pub data_type: u32,
    pub value: u64,
}

impl Scalar {
    pub fn f32(v: f32) -> Self {
        Scalar {
            data_type: DATATYPE_FLOAT_32,
            value: v.to_bits() as u64,
        }
    }
    pub fn u32(v: u32) -> Self {
        Scalar {
            data_type: DATATYPE_UINT_32,
            value: v as u64,
        }
    }
    pub fn i32(v: i32) -> Self {
        Scalar {
            data_type: DATATYPE_INT_32,
            value: v as u32 as u64,
        }
    }
    pub fn bool8(v: bool) -> Self {
        Scalar {
            data_type: DATATYPE_BOOL_8,
            value: v as u64,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union ParamValue {
    pub scalar: Scalar,
    pub tensor: Tensor,
}

/// `Qnn_Param_t`: a named scalar or static-tensor parameter of a node.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Param {
    pub param_type: u32,
    pub name: *const c_char,
    pub value: ParamValue,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct OpConfigV1 {
    pub name: *const c_char,
    pub package_name: *const c_char,
    pub type_name: *const c_char,
    pub num_params: u32,
    pub params: *mut Param,
    pub num_inputs: u32,
    pub inputs: *mut Tensor,
    pub num_outputs: u32,
    pub outputs: *mut Tensor,
}

/// `Qnn_OpConfig_t`, passed by value to validate/addNode.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct OpConfig {
    pub version: u32,
    pub v1: OpConfigV1,
}

/// `QnnDevice_Config_t`: option plus a pointer-sized union (custom config pointer).
#[repr(C)]
pub struct DeviceConfig {
    pub option: u32,
    pub custom: *const c_void,
}

/// HTP device custom config. In this library build the payload union sits at offset 8
/// (a pointer-aligned member), established by probing: see docs/qnn.md.
#[repr(C)]
pub struct HtpDeviceCustomConfig {
    pub option: u32,
    pub payload: HtpDevicePayload,
}

#[repr(C)]
pub union HtpDevicePayload {
    pub soc_model: u32,
    pub _reserve: [u64; 3],
}

/// `QnnGraph_Config_t.option` for a backend-specific config.
pub const GRAPH_CONFIG_OPTION_CUSTOM: u32 = 0;
/// `QnnHtpGraph_ConfigOption_t` values we use.
pub const HTP_GRAPH_CONFIG_OPTION_OPTIMIZATION: u32 = 1;
pub const HTP_GRAPH_CONFIG_OPTION_PRECISION: u32 = 2;
/// `QnnHtpGraph_OptimizationType_t`: the finalize optimization level (1..3).
pub const HTP_GRAPH_OPTIMIZATION_FINALIZE_FLAG: u32 = 3;
/// `Qnn_Precision_t`.
pub const PRECISION_FLOAT32: u32 = 0;
pub const PRECISION_FLOAT16: u32 = 1;

/// `QnnGraph_Config_t`: option plus a pointer-sized union (custom config pointer).
#[repr(C)]
pub struct GraphConfig {
    pub option: u32,
    pub custom: *const c_void,
}

/// `QnnHtpGraph_CustomConfig_t`: option plus a union whose largest members are 64-bit, so
/// the payload sits at offset 8. The reserve covers the larger members of newer builds
/// (the library only reads the member its option names).
#[repr(C)]
pub struct HtpGraphCustomConfig {
    pub option: u32,
    pub payload: HtpGraphPayload,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct HtpOptimization {
    pub kind: u32,
    pub value: f32,
}

#[repr(C)]
pub union HtpGraphPayload {
    pub precision: u32,
    pub optimization: HtpOptimization,
    pub _reserve: [u64; 4],
}

type Cfg = *const *const c_void;

/// The core function table, declared up to `deviceFree`; later slots exist in the
/// provider's table but we never read past this prefix. Unused slots are raw pointers.
#[repr(C)]
pub struct FunctionTable {
    pub property_has_capability: *const c_void,
    pub backend_create: Option<unsafe extern "C" fn(Handle, Cfg, *mut Handle) -> ErrorHandle>,
    pub backend_set_config: *const c_void,
    pub backend_get_api_version: Option<unsafe extern "C" fn(*mut ApiVersion) -> ErrorHandle>,
    pub backend_get_build_id: Option<unsafe extern "C" fn(*mut *const c_char) -> ErrorHandle>,
    pub backend_register_op_package: *const c_void,
    pub backend_get_supported_operations: *const c_void,
    pub backend_validate_op_config: Option<unsafe extern "C" fn(Handle, OpConfig) -> ErrorHandle>,
    pub backend_free: Option<unsafe extern "C" fn(Handle) -> ErrorHandle>,
    pub context_create:
        Option<unsafe extern "C" fn(Handle, Handle, Cfg, *mut Handle) -> ErrorHandle>,
    pub context_set_config: *const c_void,
    pub context_get_binary_size:
        Option<unsafe extern "C" fn(Handle, *mut BinarySize) -> ErrorHandle>,
    pub context_get_binary: Option<
        unsafe extern "C" fn(Handle, *mut c_void, BinarySize, *mut BinarySize) -> ErrorHandle,
    >,
    pub context_create_from_binary: Option<
        unsafe extern "C" fn(
            Handle,
            Handle,
            Cfg,
            *const c_void,
            BinarySize,
            *mut Handle,
            Handle,
        ) -> ErrorHandle,
    >,
    pub context_free: Option<unsafe extern "C" fn(Handle, Handle) -> ErrorHandle>,
    pub graph_create:
        Option<unsafe extern "C" fn(Handle, *const c_char, Cfg, *mut Handle) -> ErrorHandle>,
    pub graph_create_subgraph: *const c_void,
    pub graph_set_config: *const c_void,
    pub graph_add_node: Option<unsafe extern "C" fn(Handle, OpConfig) -> ErrorHandle>,
    pub graph_finalize: Option<unsafe extern "C" fn(Handle, Handle, Handle) -> ErrorHandle>,
    pub graph_retrieve:
        Option<unsafe extern "C" fn(Handle, *const c_char, *mut Handle) -> ErrorHandle>,
    pub graph_execute: Option<
        unsafe extern "C" fn(
            Handle,
            *const Tensor,
            u32,
            *mut Tensor,
            u32,
            Handle,
            Handle,
        ) -> ErrorHandle,
    >,
    pub graph_execute_async: *const c_void,
    pub tensor_create_context_tensor: *const c_void,
    pub tensor_create_graph_tensor:
        Option<unsafe extern "C" fn(Handle, *mut Tensor) -> ErrorHandle>,
    pub log_create: *const c_void,
    pub log_set_log_level: *const c_void,
    pub log_free: *const c_void,
    pub profile_create: *const c_void,
    pub profile_set_config: *const c_void,
    pub profile_get_events: *const c_void,
    pub profile_get_sub_events: *const c_void,
    pub profile_get_event_data: *const c_void,
    pub profile_get_extended_event_data: *const c_void,
    pub profile_free: *const c_void,
    pub mem_register: *const c_void,
    pub mem_de_register: *const c_void,
    pub device_get_platform_info: *const c_void,
    pub device_free_platform_info: *const c_void,
    pub device_get_infrastructure: *const c_void,
    pub device_create: Option<
        unsafe extern "C" fn(Handle, *const *const DeviceConfig, *mut Handle) -> ErrorHandle,
    >,
    pub device_set_config: *const c_void,
    pub device_get_info: *const c_void,
    pub device_free: Option<unsafe extern "C" fn(Handle) -> ErrorHandle>,
}

/// `QnnInterface_t`: one provider of the library, with its function table inline.
#[repr(C)]
pub struct InterfaceProvider {
    pub backend_id: u32,
    pub provider_name: *const c_char,
    pub api_version: ApiVersion,
    pub table: FunctionTable,
}

/// `QnnInterface_getProviders(const QnnInterface_t*** list, uint32_t* n)`.
pub type GetProvidersFn =
    unsafe extern "C" fn(*mut *const *const InterfaceProvider, *mut u32) -> ErrorHandle;

/// A zeroed v1 tensor description (every pointer null, types undefined).
pub fn empty_tensor() -> Tensor {
    Tensor {
        version: TENSOR_VERSION_1,
        v1: TensorV1 {
            id: 0,
            name: std::ptr::null(),
            tensor_type: 0x7FFF_FFFF,
            data_format: TENSOR_DATA_FORMAT_DENSE,
            data_type: DATATYPE_UNDEFINED,
            quantize_params: QuantizeParams::NONE,
            rank: 0,
            dimensions: std::ptr::null_mut(),
            mem_type: TENSORMEMTYPE_RAW,
            client_buf: ClientBuffer {
                data: std::ptr::null_mut(),
                data_size: 0,
            },
        },
        v2_tail: [0; 3],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn tensor_layout_matches_the_c_api() {
        assert_eq!(size_of::<QuantizeParams>(), 40);
        assert_eq!(offset_of!(TensorV1, name), 8);
        assert_eq!(offset_of!(TensorV1, data_type), 24);
        assert_eq!(offset_of!(TensorV1, quantize_params), 32);
        assert_eq!(offset_of!(TensorV1, rank), 72);
        assert_eq!(offset_of!(TensorV1, dimensions), 80);
        assert_eq!(offset_of!(TensorV1, mem_type), 88);
        assert_eq!(offset_of!(TensorV1, client_buf), 96);
        assert_eq!(size_of::<TensorV1>(), 112);
        // v2 = v1 + pointer (8) + sparse params (12) + u8, padded to 136; plus the tag.
        assert_eq!(offset_of!(Tensor, v1), 8);
        assert_eq!(size_of::<Tensor>(), 144);
    }

    #[test]
    fn param_and_op_config_layout_matches_the_c_api() {
        assert_eq!(size_of::<Scalar>(), 16);
        assert_eq!(offset_of!(Param, name), 8);
        assert_eq!(offset_of!(Param, value), 16);
        assert_eq!(size_of::<Param>(), 160);
        assert_eq!(offset_of!(OpConfigV1, num_params), 24);
        assert_eq!(offset_of!(OpConfigV1, outputs), 64);
        assert_eq!(size_of::<OpConfig>(), 80);
    }

    #[test]
    fn provider_and_table_layout() {
        assert_eq!(size_of::<ApiVersion>(), 24);
        assert_eq!(offset_of!(InterfaceProvider, backend_id), 0);
        assert_eq!(offset_of!(InterfaceProvider, provider_name), 8);
        assert_eq!(offset_of!(InterfaceProvider, api_version), 16);
        assert_eq!(offset_of!(InterfaceProvider, table), 40);
        let slot = |off: usize| off / size_of::<usize>();
        assert_eq!(slot(offset_of!(FunctionTable, backend_get_api_version)), 3);
        assert_eq!(
            slot(offset_of!(FunctionTable, context_create_from_binary)),
            13
        );
        assert_eq!(slot(offset_of!(FunctionTable, graph_retrieve)), 20);
        assert_eq!(slot(offset_of!(FunctionTable, graph_execute)), 21);
        assert_eq!(
            slot(offset_of!(FunctionTable, tensor_create_graph_tensor)),
            24
        );
        assert_eq!(slot(offset_of!(FunctionTable, device_create)), 40);
        assert_eq!(slot(offset_of!(FunctionTable, device_free)), 43);
    }

    #[test]
    fn device_config_layout() {
        assert_eq!(offset_of!(DeviceConfig, custom), 8);
        assert_eq!(offset_of!(HtpDeviceCustomConfig, payload), 8);
        assert_eq!(offset_of!(GraphConfig, custom), 8);
        assert_eq!(offset_of!(HtpGraphCustomConfig, payload), 8);
        assert_eq!(size_of::<HtpOptimization>(), 8);
    }

    #[test]
    fn scalar_encodings() {
        assert_eq!(Scalar::f32(1.5).value, 1.5f32.to_bits() as u64);
        assert_eq!(Scalar::i32(-1).value, 0xFFFF_FFFF);
        assert_eq!(Scalar::bool8(true).value, 1);
    }
}
