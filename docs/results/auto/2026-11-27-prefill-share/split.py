import sys,glob,os,collections
# per trace: serve steps only (skip CLI single-stream decode: streams<=1, no prefill, rows<=2 after a long run is ambiguous; CLI process writes too)
def load(path):
    out=[]
    for l in open(path):
        r=l.split()
        if r[0]!="TRACE": continue
        out.append(dict(s=int(r[2]),pf=int(r[4]),rows=int(r[6]),plan=float(r[8]),fwd=float(r[10]),tot=float(r[12])))
    return out
d=sys.argv[1]
rows=[]
for f in sorted(glob.glob(d+"/*.trace")):
    st=load(f)
    # drop the CLI decode: the first run of consecutive streams==1 steps of 1 row at the start (CLI runs before the server)
    i=0
    while i<len(st) and st[i]['s']<=1 and st[i]['pf']==0 and st[i]['rows']<=1: i+=1
    # CLI prefill step(s) precede; simplest: drop everything up to the first step with streams>1 or prefill>64? keep as is
    pre=[x for x in st if x['pf']>0]; dec=[x for x in st if x['pf']==0 and x['s']>1]
    f_=os.path.basename(f)
    drafted_pre=sum(x['rows']-x['pf']-x['s'] for x in pre)
    drafted_dec=sum(x['rows']-x['s'] for x in dec)
    print(f"{f_:16s} prefill steps {len(pre):4d} {sum(x['tot'] for x in pre)/1e3:6.2f} s, drafted rows {drafted_pre:5d} | decode steps(>1 stream) {len(dec):4d} {sum(x['tot'] for x in dec)/1e3:6.2f} s, drafted rows {drafted_dec:5d}, ms/step {sum(x['tot'] for x in dec)/max(1,len(dec)):.2f} rows/step {sum(x['rows'] for x in dec)/max(1,len(dec)):.2f}")
