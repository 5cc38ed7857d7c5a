"""xllamacpp answering one completion request in-process, as its users
run it. Prints the server's own account of the request (its `timings`)
as JSON on the last line of stdout; llama.cpp's log (its buffer lines at
verbosity 4) on stderr.

    python complete.py MODEL PROMPT N
"""
import json
import sys

import xllamacpp

model, prompt, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
params = xllamacpp.CommonParams()
params.model.path = model
params.n_ctx = 256
params.cpuparams.n_threads = 2
params.cpuparams_batch.n_threads = 2
params.verbosity = 4
server = xllamacpp.Server(params)
reply = server.handle_completions({"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                                   "return_tokens": True})
print(json.dumps({"timings": reply["timings"], "tokens": reply.get("tokens")}))
