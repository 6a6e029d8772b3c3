#!/bin/bash
# measured: one hf replica actor killed mid-rollout vs undisturbed, 3 interleaved pairs (docs/faults.md)
cd /tmp/faults-measure
export PYTHONPATH=$PWD APRIL_BENCH_CACHE=/work/cache/faults
PY=/work/venvs/faults/bin/python
A="run --engine ray --engine-arg replicas=2 --engine-arg num_cpus=0.25 --engine-arg router_policy=round_robin \
   --strategies sync,april --steps 24 --rollout-batch-size 8 --n-samples-per-prompt 8 --eval-every 100 --seed 0 \
   --task-arg max_n=30 --warmstart-arg steps=20 --max-response-len 96 --no-progress"
OUT=/tmp/faults-runs4
mkdir -p $OUT
for pair in 1 2 3; do
  for kind in undisturbed killed; do
    extra=""
    [ $kind = killed ] && extra="--engine-arg chaos_seed=0 --engine-arg chaos_at_tokens=[2435]"
    echo "$kind-$pair start $(date -u +%FT%TZ) $(cat /proc/loadavg)" >> $OUT/load.txt
    $PY -m april_bench $A $extra --out $OUT/$kind-$pair > $OUT/$kind-$pair.log 2>&1
    echo "$kind-$pair end   $(date -u +%FT%TZ) $(cat /proc/loadavg) rc=$?" >> $OUT/load.txt
  done
done
echo done
