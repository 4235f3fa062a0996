set -u
export NANOGRAPH_COMMIT=4df9666 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD
o=$OUT/r; mkdir -p $o ~/.triton; tar xzf .triton_cache.tgz -C ~/.triton
nvidia-smi --query-gpu=name,clocks.sm --format=csv > $o/device.txt
timeout 470 python3 -m nanograph bench spec --target qwen3-8b --drafter qwen3-0.6b --arms off,ngram:2,ngram:4,ngram:8,draft:4,self:4 --batches 1,4,16,64 --new-tokens 128 --repeats 2 --out $o/spec_full.json 2>&1 | grep -v "^INFO" > $o/spec_full.log
grep batch $o/spec_full.log
cd $OUT && tar czf r.tgz r
