"""Replays the tree cut on a bench run's rounds (those of a binary whose startup curve made
it keep more) with another verify curve (a summary.json's verify_curve) and a global kappa
(or the one given): tokens per AR round as run, and as the cut would have kept.
    python3 docs/results/sizer/2026-11-25-xeon-explore/replay.py \
      docs/results/sizer/2026-11-25-xeon-explore/oldcurve_logged \
      docs/results/sizer/2026-11-25-xeon-explore/t0_new_r1/summary.json"""
import json,sys,gzip,os,statistics as st,collections
d,curve_of=sys.argv[1],sys.argv[2]; kappa_override=float(sys.argv[3]) if len(sys.argv)>3 else None
p=os.path.join(d,"runs.jsonl")
runs=[json.loads(l) for l in (open(p) if os.path.exists(p) else gzip.open(p+".gz","rt"))]
tot=lambda x:x["draft_ms"]+x["tree_ms"]+x["verify_ms"]+x["commit_ms"]
curve=[tuple(x) for x in json.load(open(curve_of))["verify_curve"]]
def c(r):
    for (r0,c0),(r1,c1) in zip(curve,curve[1:]):
        if r<=r1: return c0+(c1-c0)*(r-r0)/(r1-r0)
    return curve[-1][1]
ar=st.mean(tot(x) for r in runs if r["method"]=="ar" for x in r["rounds"][5:])
for m in ["auto","dart"]:
    rs=[x for r in runs if r["method"]==m for x in r["rounds"][5:]]
    # verify time (excluding draft) by rows
    vt=collections.defaultdict(list)
    for x in rs: vt[x["drafted"]+1].append(tot(x)-x["draft_ms"])
    vmean={k:st.mean(v) for k,v in vt.items() if len(v)>=5}
    def vtime(rows):
        if rows in vmean: return vmean[rows]
        return c(rows)*vmean[1]/c(1)
    dr=[x for x in rs if x.get("conf")]
    kappa=kappa_override or sum(x["accepted"] for x in dr)/sum(sum(x["conf"]) for x in dr)
    T_old=T_new=0; tok_old=tok_new=0; dropped=collections.Counter(); dtok=0; dtime=0
    for x in rs:
        conf=x.get("conf",[]); path=x.get("path",[])
        T_old+=tot(x); tok_old+=x["accepted"]+1
        if not conf:
            T_new+=tot(x); tok_new+=x["accepted"]+1; continue
        # new cut: argmax (1+k*sum)/(c(n+1)+draft)
        dm=x["draft_ms"]; e=1; best=0; bs=1/(c(1)+dm)
        for i,p in enumerate(conf):
            e+=kappa*p; s=e/(c(i+2)+dm)
            if s>bs: best,bs=i+1,s
        acc=0
        for nid in path:
            if nid<best: acc+=1
            else: break
        T_new+=dm+vtime(best+1); tok_new+=acc+1
        if best<len(conf):
            dropped[(len(conf),best)]+=1
    print(f"{m}: kappa {kappa:.2f}; actual (old cut) {tok_old/(T_old/ar):.3f} tok/AR-round; emulated new cut {tok_new/(T_new/ar):.3f}")
    print("   (kept,new) most common:", dropped.most_common(6))
