import sys, time
s = time.perf_counter()
from nanograph import LLM
llm = LLM(sys.argv[1], load_format="dummy", cuda_graph_capture="startup")
print(f"READY {sys.argv[2]} {time.perf_counter() - s:.2f} s", flush=True)
