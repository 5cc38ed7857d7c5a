"""A speech WAV for whisper: espeak-ng says TEXT, resampled to the 16 kHz
mono 16-bit PCM whisper.cpp takes (espeak-ng speaks at 22,050 Hz).

    python speech.py OUT.wav TEXT
"""
from __future__ import annotations

import io
import subprocess
import sys
import wave

import numpy as np

RATE = 16000


def main() -> None:
    out, text = sys.argv[1], sys.argv[2]
    # A fixed voice and speed: the same words give the same file.
    said = subprocess.run(["espeak-ng", "-v", "en-us", "-s", "135", "--stdout", text], capture_output=True,
                          check=True).stdout
    with wave.open(io.BytesIO(said)) as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2, (w.getnchannels(), w.getsampwidth())
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64)
    # Band-limited resampling in the frequency domain (no filter design needed).
    n_out = round(len(pcm) * RATE / rate)
    spectrum = np.fft.rfft(pcm)[: n_out // 2 + 1]
    resampled = np.fft.irfft(spectrum, n=n_out) * (n_out / len(pcm))
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(np.clip(np.round(resampled), -32768, 32767).astype("<i2").tobytes())


if __name__ == "__main__":
    main()
