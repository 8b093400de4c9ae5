"""Per node of a bench run's trees: its path probability (conf, binned) against how often it
was on the accepted path; and per set, the first node's.
    python3 docs/results/sizer/2026-11-25-xeon-explore/calib.py RUN_DIR   (e.g. fixed8)"""
import json,sys,collections,gzip,os
def load(d):
    p=os.path.join(d,"runs.jsonl")
    return [json.loads(l) for l in (open(p) if os.path.exists(p) else gzip.open(p+".gz","rt"))]
runs=load(sys.argv[1])
edges=[0,0.02,0.05,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.01]
for m in sorted({r["method"] for r in runs}-{"ar"}):
    for ds in [None]+sorted({r["dataset"] for r in runs}):
        b=collections.defaultdict(lambda:[0,0.0,0])
        top=collections.defaultdict(lambda:[0,0.0,0])
        nodes=0
        for r in runs:
            if r["method"]!=m or (ds and r["dataset"]!=ds): continue
            for x in r["rounds"]:
                conf=x.get("conf",[]); path=set(x.get("path",[]))
                for i,c in enumerate(conf):
                    k=next(j for j in range(len(edges)-1) if c<edges[j+1])
                    b[k][0]+=1; b[k][1]+=c; b[k][2]+= i in path
                    nodes+=1
                if conf:
                    t=top[0]; t[0]+=1; t[1]+=conf[0]; t[2]+= 0 in path
        if ds is None:
            print(f"== {m}: {nodes} nodes")
            for k in sorted(b):
                n,sc,acc=b[k]
                print(f"  conf [{edges[k]:.2f},{edges[k+1]:.2f}): n {n:6d} mean conf {sc/n:.3f} accepted {acc/n:.3f}  ratio {acc/max(sc,1e-9):.2f}")
        t=top[0]
        if t[0]: print(f"  {ds or 'all'}: first node n {t[0]} conf {t[1]/t[0]:.3f} accepted {t[2]/t[0]:.3f}")
