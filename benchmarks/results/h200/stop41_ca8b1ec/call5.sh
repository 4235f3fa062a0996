set -u
export NANOGRAPH_COMMIT=${C:-wip} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
root=$PWD; o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
cp ab/prof_gaps.py /tmp/
(PYTHONPATH=$root timeout 200 python3 /tmp/prof_gaps.py main 2>&1 | grep -v "^INFO" > $o/prof_gaps.log); cat $o/prof_gaps.log | tail -60
cd $OUT && tar czf r.tgz r
