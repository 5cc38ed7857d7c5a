"""pywhispercpp transcribing a WAV, as its users run it: prints the
transcript (one segment a line) on stdout; whisper.cpp's log, ending with
its timings, on stderr.

    python transcribe.py MODEL.bin SPEECH.wav [--ggml-debug]

--ggml-debug passes ggml's debug-level messages too (whisper.cpp's own
logger drops them): with GGML_SCHED_DEBUG=2 in the environment, that is
the scheduler's print of every graph it splits, node by node.
"""
import sys

import _pywhispercpp
from pywhispercpp.model import Model

model, speech = sys.argv[1], sys.argv[2]
debug = "--ggml-debug" in sys.argv[3:]
if debug:
    _pywhispercpp.whisper_log_set(lambda level, text: sys.stderr.write(text))
# Greedy decoding on two threads: the same transcript on every run.
whisper = Model(model, n_threads=2, redirect_whispercpp_logs_to=False, print_progress=False,
                print_realtime=False)
for segment in whisper.transcribe(speech):
    print(segment.text.strip())
# whisper.cpp's own account of the run (encode and decode runs), on stderr.
whisper.print_timings()
if debug:
    # Back to whisper.cpp's logger before the interpreter goes: the model's
    # destructor logs, and a Python callback then would have no interpreter.
    _pywhispercpp.whisper_log_set(None)
