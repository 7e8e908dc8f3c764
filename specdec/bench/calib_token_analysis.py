"""Per output token of a replay capture (specdec/examples/replay_capture.rs): brute-force
longest suffix match (first occurrence, like SAM); whether the raw text after it is the next
output token, and where the text token / the actual token ranked in the prefill top-k there.
Usage: python3 calib_token_analysis.py CAPTURE.jsonl [K]"""
import json,sys,collections
def run(path, K=4):
    st=collections.Counter()
    for line in open(path):
        r=json.loads(line); P=r['prompt']; out=r['output'][:128]; k=r['k']
        ids=r['topk_ids']
        for i in range(1,len(out)):
            ctx=P+out[:i]; n=len(ctx)
            # longest suffix (<=32) with an earlier occurrence; first occurrence end
            best=None
            for L in range(min(32,n-1),0,-1):
                suf=ctx[n-L:]
                # first occurrence ending before n-1
                for e in range(L-1,n-1):
                    if ctx[e-L+1:e+1]==suf:
                        best=(L,e);break
                if best: break
            act=out[i]
            if not best: st['nomatch']+=1; continue
            L,e=best
            pred=ctx[e+1]
            inprompt = e < len(P)
            lb = 'L>=5' if L>=5 else 'L<5'
            if pred==act:
                if e < len(P):
                    row=ids[e*k:(e+1)*k]
                    st[(lb,'text-hit, top1==text' if row[0]==pred else ('text-hit, text in topk rank%d'%row.index(pred) if pred in row else 'text-hit, text not in topk'))]+=1
                else: st[(lb,'text-hit-output')]+=1
                continue
            if not inprompt: st[(lb,'miss-in-output')]+=1; continue
            row=ids[e*k:(e+1)*k][:K]
            if act in row: st[(lb,'miss-topk-rank%d'%row.index(act))]+=1
            else: st[(lb,'miss-not-topk')]+=1
    for k_,v in sorted(st.items(), key=str): print(k_,v)
run(sys.argv[1], int(sys.argv[2]) if len(sys.argv)>2 else 4)
