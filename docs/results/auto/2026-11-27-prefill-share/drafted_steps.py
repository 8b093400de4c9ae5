"""Per traced run (DIR/new_r*.trace): 4-stream steps without prompt rows, those with drafted rows
against those without: extra forward ms (and per extra row), extra planning (drafting) ms, extra
commit ms."""
import glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/new_*.trace")):
    st = [l.split() for l in open(f) if l.startswith("TRACE")]
    dec = [(int(r[6]), float(r[8]), float(r[10]), float(r[12])) for r in st if int(r[4]) == 0 and int(r[2]) == 4]
    nd = [x for x in dec if x[0] == 4]
    d = [x for x in dec if x[0] > 4]
    a = lambda v, i: sum(x[i] for x in v) / len(v)
    fwd = a(d, 2) - a(nd, 2)
    post = (a(d, 3) - a(d, 1) - a(d, 2)) - (a(nd, 3) - a(nd, 1) - a(nd, 2))
    print(f"{f.split('/')[-1]}: {len(d)} drafted steps, {a(d, 0):.2f} rows; forward +{fwd:.2f} ms "
          f"({fwd / (a(d, 0) - 4):.2f} per extra row), drafting +{a(d, 1) - a(nd, 1):.2f} ms, commit +{post:.2f} ms")
