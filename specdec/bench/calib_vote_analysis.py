"""At short suffix matches (< 5 tokens): how often the first occurrence's next token (SAM),
the majority raw continuation, and the summed prefill top-4 votes over every prompt
occurrence of the suffix predict the next output token. Usage: python3 calib_vote_analysis.py CAPTURE.jsonl"""
import json,sys,collections,math
def run(path):
    st=collections.Counter()
    for line in open(path):
        r=json.loads(line); P=r['prompt']; out=r['output'][:128]; k=r['k']
        ids=r['topk_ids']; lg=r['topk_logits']
        def probs(e):
            l=lg[e*k:(e+1)*k][:4]; m=max(l); z=sum(math.exp(x-m) for x in l)
            return list(zip(ids[e*k:(e+1)*k][:4],[math.exp(x-m)/z for x in l]))
        for i in range(1,len(out)):
            ctx=P+out[:i]; n=len(ctx); best=None
            for L in range(min(32,n-1),0,-1):
                suf=ctx[n-L:]
                for e in range(L-1,n-1):
                    if ctx[e-L+1:e+1]==suf: best=(L,e);break
                if best: break
            if not best: continue
            L,e=best
            if L>=5: continue
            act=out[i]
            sam=ctx[e+1]
            # all prompt occurrences of the suffix
            occ=[q for q in range(L-1,len(P)-1) if P[q-L+1:q+1]==ctx[n-L:]]
            raw=collections.Counter(P[q+1] for q in occ)
            agg=collections.Counter()
            for q in occ:
                for t,p in probs(q): agg[t]+=p
            rawtop=raw.most_common(1)[0][0] if raw else None
            aggtop=[t for t,_ in agg.most_common(3)]
            st['n']+=1
            st['sam']+= sam==act
            st['raw-majority']+= rawtop==act
            st['agg-top1']+= bool(aggtop) and aggtop[0]==act
            st['agg-top3']+= act in aggtop
            st['sam or agg-top1']+= sam==act or (bool(aggtop) and aggtop[0]==act)
            st['sam or agg-top3']+= sam==act or act in aggtop
            st['sam or raw-maj']+= sam==act or rawtop==act
    print(dict(st))
run(sys.argv[1])
