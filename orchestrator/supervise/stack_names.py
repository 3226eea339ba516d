"""Where a thread is, named as a user would look for it: in the user's program, with the
library call it made, and the innermost frame beside them.

The rule (frames innermost first):

- The user's frames are those whose file is not an installed package (site-packages,
  dist-packages), not the standard library, not our stack hook and not frozen start-up
  code (`is_user_frame`). The deepest of them is where the user's program is.
- Where that frame called into a library (a package, or a module of the standard library)
  and waits there, the library call is the innermost frame of that same library, counted
  inward from the call without leaving it: the `all_reduce` of torch.distributed (not its
  logging wrapper, nor the C++ wait), DataLoader's `_try_get_data` (not the `select` of the
  multiprocessing pipe it polls), queue's `get` (not threading's `wait`).
- A thread is shown as `CALL <- USER <- OUTER USER ...` (up to USER_FRAMES of the user's),
  and, where the innermost frame is neither, `; innermost FRAME` after them. A thread with
  no frame of the user's shows its innermost frames.

So a rank whose main thread waits on its DataLoader reads `main thread in
_MultiProcessingDataLoaderIter._try_get_data (torch/utils/data/dataloader.py:1291) <- train
(train.py:19) <- <module> (train.py:27); innermost _PollLikeSelector.select
(selectors.py:415)`, and one waiting in a collective `main thread in all_reduce
(torch/distributed/distributed_c10d.py:3252) <- step (train.py:30)`.

Pure: frames in, text out.
"""

from __future__ import annotations

import re

USER_FRAMES = 3  # frames of the user's code shown per thread
# Where code is not the user's: installed packages (torch and the rest), the interpreter's
# standard library (threading, queue, selectors, ...), and our own stack hook.
_INSTALLED = re.compile(r"/(?:site|dist)-packages/")
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?t?/|/python\d+\.zip/")
_HOOK = "/stack_hook/sitecustomize.py"


def is_user_frame(frame: dict) -> bool:
    """Whether a frame is the user's code: not an installed package, not the standard
    library, not our hook, not frozen start-up code."""
    path = str(frame.get("file") or "")
    if path.startswith("<frozen"):
        return False
    return not (_INSTALLED.search(path) or _STDLIB.search(path) or path.endswith(_HOOK))


def library_of(frame: dict) -> str:
    """Which library a frame that is not the user's belongs to: its package's top folder
    (`torch`, `multiprocessing`) or its module's file (`selectors.py`); else its file."""
    path = str(frame.get("file") or "")
    for pattern in (_INSTALLED, _STDLIB):
        ends = [found.end() for found in pattern.finditer(path)]
        if ends:
            return path[ends[-1] :].split("/", 1)[0]
    return path


def innermost_user_frames(frames: list[dict], n: int = USER_FRAMES) -> list[dict]:
    """The `n` innermost frames of the user's code in a thread's frames (innermost first);
    where there are none, the `n` innermost frames."""
    return [frame for frame in frames if is_user_frame(frame)][:n] or frames[:n]


def library_call(frames: list[dict]) -> dict | None:
    """The library call the deepest frame of the user's made (see the module docstring);
    None where the innermost frame is the user's, or no frame is."""
    deepest = next((i for i, frame in enumerate(frames) if is_user_frame(frame)), None)
    if not deepest:  # None: no frame of the user's; 0: the user's own frame is innermost
        return None
    call = deepest - 1
    library = library_of(frames[call])
    while call > 0 and library_of(frames[call - 1]) == library:
        call -= 1
    return frames[call]


def short_file(path: str) -> str:
    """A frame's file as shown: within its package or the standard library
    (`torch/distributed/distributed_c10d.py`, `threading.py`), else the file's name
    (`train.py`; `model/__init__.py` for a package's)."""
    for pattern in (_INSTALLED, _STDLIB):
        ends = [found.end() for found in pattern.finditer(path)]
        if ends:
            return path[ends[-1] :]
    parts = path.rsplit("/", 2)
    if parts[-1] == "__init__.py" and len(parts) > 1:
        return "/".join(parts[-2:])
    return parts[-1]


def frame_text(frame: dict) -> str:
    line = frame.get("line")
    where = short_file(str(frame.get("file") or "?"))
    return f"{frame.get('function') or '?'} ({where}:{line if line is not None else '?'})"


def thread_text(frames: list[dict]) -> str:
    """Where a thread is (see the module docstring)."""
    if not frames:
        return "no Python frame"
    shown = innermost_user_frames(frames)
    call = library_call(frames)
    if call is not None:
        shown = [call, *shown]
    text = " <- ".join(frame_text(frame) for frame in shown)
    if frames[0] is not shown[0]:
        text += f"; innermost {frame_text(frames[0])}"
    return text
