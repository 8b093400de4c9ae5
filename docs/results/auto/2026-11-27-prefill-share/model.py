import sys,glob,os,statistics
def load(path):
    out=[]
    for l in open(path):
        r=l.split()
        if r[0]!="TRACE": continue
        s,pf,rows,tot=int(r[2]),int(r[4]),int(r[6]),float(r[12])
        if s<=1 and pf==0: continue   # the CLI's decode
        out.append((rows,tot))
    return out
d=sys.argv[1]
data={os.path.basename(f)[:-6]:load(f) for f in sorted(glob.glob(d+"/*.trace"))}
allv=[x for v in data.values() for x in v]
n=len(allv); sx=sum(x for x,_ in allv); sy=sum(y for _,y in allv); sxx=sum(x*x for x,_ in allv); sxy=sum(x*y for x,y in allv)
b=(n*sxy-sx*sy)/(n*sxx-sx*sx); a=(sy-b*sx)/n
print("fit: ms = %.2f + %.3f * rows"%(a,b))
res={}
for k,v in data.items():
    mod=sum(a+b*x for x,_ in v)/1e3
    res[k]=(len(v),sum(x for x,_ in v),mod,sum(y for _,y in v)/1e3)
    print(f"{k:8s} steps {len(v):4d} rows {res[k][1]:6d} modeled {mod:6.2f} s measured {res[k][3]:6.2f} s")
for arm in ["ar","old","new"]:
    ks=[k for k in res if k.startswith(arm+"_")]
    print(arm, "modeled mean %.2f s"%statistics.mean([res[k][2] for k in ks]), "rows mean %.0f"%statistics.mean([res[k][1] for k in ks]), "steps mean %.0f"%statistics.mean([res[k][0] for k in ks]))
