#!/usr/bin/env python3
"""Speedup (over the same run's AR) and tau micro per repeat, per set and method (a: default
sources, b: + recycle), and the geometric mean of the per-set medians. Usage: compare.py OUT."""
import json,sys,glob,math,collections,statistics
d=sys.argv[1]
res=collections.defaultdict(list)
for f in sorted(glob.glob(d+'/*/summary.json')):
    tag=f.split('/')[-2]; ab,t,rep=tag.split('-')
    for r in json.load(open(f))['summaries']:
        if r['method']=='ar': continue
        res[(t,ab+':'+r['method'],r['dataset'])].append((r['speedup'],r['tau_micro']))
for t in sorted({k[0] for k in res}):
  ms=sorted({k[1] for k in res if k[0]==t}); ds=sorted({k[2] for k in res if k[0]==t})
  print(t, 'dataset', *ms)
  for x in ds:
    print(t, x, *['sp %s tau %s' % ('/'.join('%.2f'%v[0] for v in res[(t,m,x)]), '/'.join('%.2f'%v[1] for v in res[(t,m,x)])) for m in ms])
  for m in ms:
    vals=[statistics.median([v[0] for v in res[(t,m,x)]]) for x in ds]
    print(t,m,'geomean of medians %.3f'%math.exp(sum(map(math.log,vals))/len(vals)))
