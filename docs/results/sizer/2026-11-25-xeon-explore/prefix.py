"""What cuts of n = 1, 2, 3, 4, 6, 8 nodes would have predicted (sum of conf) and got accepted,
by the first node's conf, over a bench run's trees.
    python3 docs/results/sizer/2026-11-25-xeon-explore/prefix.py RUN_DIR"""
import json,sys,collections,gzip,os
def load(d):
    p=os.path.join(d,"runs.jsonl")
    return [json.loads(l) for l in (open(p) if os.path.exists(p) else gzip.open(p+".gz","rt"))]
runs=load(sys.argv[1])
edges=[0,0.2,0.3,0.4,0.6,1.01]
for m in sorted({r["method"] for r in runs}-{"ar"}):
    b=collections.defaultdict(lambda:[0,0.0,0])
    for r in runs:
        if r["method"]!=m: continue
        for x in r["rounds"]:
            c=x.get("conf",[]); path=x.get("path",[])
            if not c: continue
            k=next(j for j in range(len(edges)-1) if c[0]<edges[j+1])
            for n in (1,2,3,4,6,8):
                if n>len(c): break
                acc=0
                for nid in path:
                    if nid<n: acc+=1
                    else: break
                e=b[(k,n)]; e[0]+=1; e[1]+=sum(c[:n]); e[2]+=acc
    print(m)
    for k in range(len(edges)-1):
        cells=[f"n={n}: pred {b[(k,n)][1]/b[(k,n)][0]:.2f} got {b[(k,n)][2]/b[(k,n)][0]:.2f}" for n in (1,2,3,4,6,8) if b[(k,n)][0]]
        if cells: print(f"  first conf [{edges[k]},{edges[k+1]}) ({b[(k,1)][0]}): "+"; ".join(cells))
