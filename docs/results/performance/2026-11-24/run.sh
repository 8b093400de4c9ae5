#!/bin/bash
cd /work/main
scripts/campaign.sh pause
sleep 2
for r in 1 2; do
  /tmp/pd_old bench-kernels --threads 2 --repeats 5 --json > /tmp/kb/old_avx512_$r.json 2>/dev/null
  /tmp/pd_new bench-kernels --threads 2 --repeats 5 --json > /tmp/kb/new_avx512_$r.json 2>/dev/null
done
PARADRAFT_ISA=avx2 /tmp/pd_new bench-kernels --threads 2 --repeats 5 --json --llama-bench /tmp/llama_cpp_python-0.3.16/vendor/llama.cpp/build-avx2/bin/llama-bench > /tmp/kb/avx2_llama.json 2>/tmp/kb/avx2.err
PARADRAFT_ISA=avxvnni /tmp/pd_new bench-kernels --threads 2 --repeats 5 --json > /tmp/kb/avxvnni.json 2>/dev/null
/tmp/pd_new bench-kernels --threads 2 --repeats 5 --json --llama-bench /tmp/llama_cpp_python-0.3.16/vendor/llama.cpp/build-native/bin/llama-bench > /tmp/kb/avx512_llama.json 2>/tmp/kb/avx512.err
PARADRAFT_ISA=avx2 /tmp/pd_old bench-kernels --threads 2 --repeats 5 --json > /tmp/kb/old_avx2.json 2>/dev/null
scripts/campaign.sh resume
echo done > /tmp/kb/done
