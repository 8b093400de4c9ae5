"""Speedup over AR per set and method, and the share of rounds that verified no draft node
("none"), for run folders of a bench A/B; geomean over the sets per method.
    python3 undrafted.py DIR RUN [RUN ...]     (e.g. DIR = this folder, RUN = t0_old_r1)"""
import json,collections,sys,gzip,os
for name in sys.argv[2:]:
    d=os.path.join(sys.argv[1],name)
    p=d+'/runs.jsonl'
    f=open(p) if os.path.exists(p) else gzip.open(p+'.gz','rt')
    tok=collections.Counter(); ms=collections.Counter(); none=collections.Counter(); n=collections.Counter()
    for l in f:
        r=json.loads(l); k=(r['dataset'],r['method']); tok[k]+=r['generated']; ms[k]+=r['decode_ms']
        for x in r['rounds']:
            n[k]+=1; none[k]+= x['drafted']==0
    out=[]
    import math
    g=collections.defaultdict(list)
    for ds in ['copy','gsm8k','humaneval','math500','mt_bench']:
        if not ms[ds,'ar']: continue
        ar=tok[ds,'ar']/ms[ds,'ar']
        cells=[]
        for m in sorted({m for _,m in tok if m!='ar'}):
            sp=tok[ds,m]/ms[ds,m]/ar; g[m].append(math.log(sp))
            cells.append(f"{m} {sp:.3f}x none {none[ds,m]/max(1,n[ds,m])*100:.0f}%")
        out.append(f"  {ds:9} "+' | '.join(cells))
    print(name, ' '.join(f"{m} geo {math.exp(sum(v)/len(v)):.3f}" for m,v in g.items())); print('\n'.join(out))
