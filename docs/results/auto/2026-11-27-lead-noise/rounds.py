# Per method and set: rounds, tau, nodes verified a round, estimated and accepted nodes a round, ms a round;
# then by nodes verified (capped at 8): rounds, accepted (a), estimated (p), verify ms (v). Usage: python3 rounds.py runs.jsonl
import json,collections,sys
R=collections.defaultdict(list)
for line in open(sys.argv[1]):
    r=json.loads(line)
    for x in r['rounds']:
        R[(r['dataset'],r['method'])].append(x)
for k,v in sorted(R.items()):
    n=len(v)
    acc=sum(x['accepted'] for x in v); dr=sum(x['drafted'] for x in v)
    pred=sum(x['predicted'] for x in v)
    t=sum(x['draft_ms']+x['select_ms']+x['tree_ms']+x['verify_ms']+x['commit_ms'] for x in v)
    byd=collections.defaultdict(lambda:[0,0,0.0,0.0])
    for x in v:
        b=min(x['drafted'],8); byd[b][0]+=1; byd[b][1]+=x['accepted']; byd[b][2]+=x['verify_ms']; byd[b][3]+=x['predicted']
    print(k, f"rounds {n} tau {(n+acc)/n:.3f} drafted/round {dr/n:.2f} pred {pred/n:.3f} acc {acc/n:.3f} ms/round {t/n:.2f} tok/ms {(n+acc)/t:.4f}")
    print('   ', ' '.join(f"{d}:{c[0]}r a{c[1]/c[0]:.2f} p{c[3]/c[0]:.2f} v{c[2]/c[0]:.2f}" for d,c in sorted(byd.items())))
