"""The feeds of the small real models whose control flow reads input values (bench/models_vs_ort.py
builds with them as --inputs and times on them): silero-vad's sample rate picks its 16 kHz branch and
its recurrent state starts at zero, as the package feeds them. Writes NAME.npz beside this script.

    python bench/small_models/make_feeds.py
"""

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main():
    rng = np.random.default_rng(0)
    chunk = lambda: (0.1 * rng.standard_normal((1, 512))).astype(np.float32)  # noqa: E731 - 32 ms of audio
    state = np.zeros((2, 1, 128), np.float32)
    for name in ("silero_op15", "silero_v6"):
        np.savez(HERE / f"{name}.npz", input=chunk(), state=state, sr=np.array(16000, np.int64))
    np.savez(HERE / "silero_half.npz", input=chunk(), state=state)


if __name__ == "__main__":
    main()
