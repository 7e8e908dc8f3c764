"""Hit rate of the raw text after the longest suffix match, by match length (< 5 / >= 5),
by where the text token ranked in the prefill top-k there and by the top-1 probability.
Usage: python3 calib_rank_hit_rates.py CAPTURE.jsonl"""
import json,sys,collections,math
def run(path):
    hit=collections.Counter(); tot=collections.Counter()
    for line in open(path):
        r=json.loads(line); P=r['prompt']; out=r['output'][:128]; k=r['k']
        ids=r['topk_ids']; lg=r['topk_logits']
        for i in range(1,len(out)):
            ctx=P+out[:i]; n=len(ctx); best=None
            for L in range(min(32,n-1),0,-1):
                suf=ctx[n-L:]
                for e in range(L-1,n-1):
                    if ctx[e-L+1:e+1]==suf: best=(L,e);break
                if best: break
            if not best or best[1]>=len(P): continue
            L,e=best; pred=ctx[e+1]; act=out[i]
            row=ids[e*k:(e+1)*k]; l=lg[e*k:(e+1)*k][:4]
            m=max(l); z=sum(math.exp(x-m) for x in l); p=[math.exp(x-m)/z for x in l]
            rk=row.index(pred) if pred in row else 99
            b=('top1' if rk==0 else 'top2-4' if rk<4 else 'top5-16' if rk<16 else 'out')
            pb = 'p1>.9' if p[0]>0.9 else 'p1>.5' if p[0]>0.5 else 'p1<.5'
            key=('L>=5' if L>=5 else 'L<5', b, pb)
            tot[key]+=1; hit[key]+= pred==act
    for key in sorted(tot): print(key, tot[key], '%.2f'%(hit[key]/tot[key]))
run(sys.argv[1])
