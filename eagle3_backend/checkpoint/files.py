"""Reading and writing the files of a draft checkpoint directory.

Safetensors only by default: pickle files (``.bin``/``.pt``/``.pth``) can run
arbitrary code when loaded, so they are refused unless the caller passes
``allow_pickle=True``, and then read with ``torch.load(weights_only=True)``.
Writes go to a temporary directory next to the destination that is renamed
into place at the end, so a failure never leaves a half-written checkpoint
or destroys an existing one. The temporary names carry the writer's pid and
host; the next write to the same destination removes what a killed writer
(SIGKILL, power loss) left behind.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from eagle3_backend.errors import CheckpointError

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


def checkpoint_dir(path: str | os.PathLike[str]) -> Path:
    """The checkpoint directory for ``path`` (a directory or its config.json)."""
    p = Path(path)
    if p.is_file() and p.name == CONFIG_NAME:
        return p.parent
    if not p.exists():
        raise CheckpointError(
            f"checkpoint {str(p)!r} does not exist; expected a draft checkpoint directory "
            f"holding config.json and model.safetensors. Check the path."
        )
    if p.is_file() and p.suffix.lower() == ".gguf":
        raise CheckpointError(
            f"checkpoint {str(p)!r} is a GGUF model file (a target, not a draft); expected the "
            f"draft checkpoint directory (config.json + model.safetensors). Pass the draft's "
            f"directory; the GGUF goes to --target."
        )
    if not p.is_dir():
        raise CheckpointError(
            f"checkpoint {str(p)!r} is a file; expected the draft checkpoint directory "
            f"(config.json + model.safetensors). Pass the directory that holds it."
        )
    return p


def read_config(ckpt: Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a checkpoint directory (a JSON object)."""
    path = ckpt / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(
            f"{ckpt}: no config.json; expected the draft's HF-style config.json next to its "
            f"weights. Copy it from the training run's output directory."
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc}). Check the file's permissions.") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"{path}: is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            f"expected the draft's config.json object. Fix or regenerate the file."
        ) from None
    if not isinstance(raw, dict):
        raise CheckpointError(
            f"{path}: top level is a JSON {type(raw).__name__}; expected an object "
            f"{{\"architectures\": [...], \"hidden_size\": ...}}. Regenerate the file."
        )
    return raw


def _safetensors_files(ckpt: Path) -> list[Path]:
    index = ckpt / SAFETENSORS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(
                f"{index}: cannot read its 'weight_map' ({type(exc).__name__}: {exc}); expected "
                f"{{\"weight_map\": {{tensor: file}}}}. Regenerate the index or remove it."
            ) from None
        # lexically: a hub snapshot's shards are links into its blob store, which is fine
        home = os.path.normpath(ckpt)
        outside = [n for n in names if os.path.dirname(os.path.normpath(os.path.join(home, n))) != home]
        if outside:
            raise CheckpointError(
                f"{index}: names shard(s) {outside} outside {ckpt}; expected the draft's own "
                f"files. Put the shards next to the index and name them by file name.")
        missing = [n for n in names if not (ckpt / n).is_file()]
        if missing:
            raise CheckpointError(
                f"{index}: names shard(s) {missing} that are not in {ckpt}. Copy the missing "
                f"shards next to the index."
            )
        return [ckpt / n for n in names]
    return sorted(ckpt.glob("*.safetensors"))


def pickle_files(directory: Path) -> list[Path]:
    """The pickle weight files (.bin/.pt/.pth) directly in ``directory``, sorted."""
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES)


def read_tensors(ckpt: Path, allow_pickle: bool = False) -> tuple[dict[str, torch.Tensor], list[str]]:
    """All tensors of the checkpoint (name -> CPU tensor) and the files they came from."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = _safetensors_files(ckpt)
    tensors: dict[str, torch.Tensor] = {}
    origin: dict[str, Path] = {}

    def add(name: str, tensor: Any, path: Path) -> None:
        if name in tensors:
            raise CheckpointError(
                f"{ckpt}: tensor {name!r} is stored twice ({origin[name].name} and {path.name}); "
                f"expected each tensor once. Remove the stale file."
            )
        if not isinstance(tensor, torch.Tensor):
            raise CheckpointError(
                f"{path}: entry {name!r} is a {type(tensor).__name__}, not a tensor; expected a "
                f"flat state dict of tensors. Re-export the draft's state_dict()."
            )
        tensors[name], origin[name] = tensor, path

    if files:
        for path in files:
            try:
                loaded = load_file(str(path), device="cpu")
            except (SafetensorError, OSError, ValueError) as exc:
                raise CheckpointError(
                    f"{path}: not a readable safetensors file ({exc}); re-copy or re-export it."
                ) from None
            for name, tensor in loaded.items():
                add(name, tensor, path)
        return tensors, [p.name for p in files]

    pickles = pickle_files(ckpt)
    if not pickles:
        raise CheckpointError(
            f"{ckpt}: no weights found; expected model.safetensors (or sharded *.safetensors). "
            f"Copy the weights next to config.json."
        )
    names = ", ".join(p.name for p in pickles)
    if not allow_pickle:
        raise CheckpointError(
            f"{ckpt}: weights are in pickle file(s) {names}, which can run arbitrary code when "
            f"loaded, so they are refused; expected model.safetensors. If you trust the file, "
            f"make a safetensors copy once and use it (a server or `eagle3 swap` too): `eagle3 "
            f"convert {ckpt} OUT --to sglang --allow-pickle` (read with torch.load(weights_only="
            f"True)); the other eagle3 commands also take --allow-pickle."
        )
    for path in pickles:
        logger.warning("loading pickle file %s with torch.load(weights_only=True)", path)
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # UnpicklingError, RuntimeError, EOFError ...
            raise CheckpointError(
                f"{path}: torch.load(weights_only=True) failed ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); expected a plain state dict "
                f"of tensors. Re-export it with torch.save(model.state_dict()) or as safetensors."
            ) from None
        if isinstance(obj, Mapping) and len(obj) == 1:
            (only,) = obj.values()
            if isinstance(only, Mapping) and next(iter(obj)) in ("state_dict", "model", "module"):
                obj = only
        if not isinstance(obj, Mapping):
            raise CheckpointError(
                f"{path}: holds a {type(obj).__name__}; expected a state dict (name -> tensor). "
                f"Re-export it with torch.save(model.state_dict())."
            )
        for name, tensor in obj.items():
            add(str(name), tensor, path)
    return tensors, [p.name for p in pickles]


# ----------------------------------------------------------------------------- writing
# What a draft checkpoint directory is made of: the only entries ``--force`` may replace.
TRAIN_REPORT = "train_report.json"  # eagle3 train's record of the run, beside the weights
OWN_NAMES = frozenset({CONFIG_NAME, SAFETENSORS_INDEX, "generation_config.json", TRAIN_REPORT})
OWN_SUFFIXES = (".safetensors",) + PICKLE_SUFFIXES


def force_help(metavar: str) -> str:
    """The ``--force`` help of every command that writes a checkpoint (see check_destination)."""
    return (f"replace an existing {metavar} that holds only a draft checkpoint (config.json, "
            "*.safetensors, train_report.json); refused if it holds other files or the input")


def _foreign_entries(dst: Path) -> list[str]:
    """Entries of ``dst`` that are not checkpoint files (subdirectories, links, other files)."""
    return sorted(p.name for p in dst.iterdir()
                  if p.is_symlink() or not p.is_file()
                  or not (p.name in OWN_NAMES or p.suffix in OWN_SUFFIXES))


def _is_within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def check_destination(dst: str | os.PathLike[str], force: bool,
                      sources: Sequence[str | os.PathLike[str] | None] = ()) -> None:
    """Refuse a destination whose replacement could lose anything.

    ``dst`` must not be (or hold) one of ``sources`` (the input checkpoint, the target),
    must not be a symbolic link, and may be non-empty only with ``force`` and only when it
    holds nothing but checkpoint files (config.json, *.safetensors, train_report.json,
    pickle weights): ``--force`` never deletes a directory of other files.

    It first clears what killed writes to ``dst`` left next to it (:func:`_sweep_dead_writes`),
    so a checkpoint a killed ``--force`` write was replacing is back in place, and checked,
    before anything is written.
    """
    dst = Path(dst)
    _sweep_dead_writes(dst.absolute())
    real = dst.resolve()
    for src in sources:
        if src is None:
            continue
        s = Path(src).resolve()
        if _is_within(s, real):
            what = "is" if s == real else "holds"
            raise CheckpointError(
                f"destination {str(dst)!r} {what} the input {str(src)!r}; writing there would "
                f"destroy it. Choose a new output directory outside the input."
            )
    if dst.is_symlink():
        raise CheckpointError(
            f"destination {str(dst)!r} is a symbolic link to {str(real)!r}; expected a new or "
            f"empty directory. Pass the real directory or a new path."
        )
    if dst.exists() and not dst.is_dir():
        raise CheckpointError(
            f"destination {str(dst)!r} is a file; expected a new or empty directory. "
            f"Choose another output path."
        )
    if not dst.is_dir() or not any(dst.iterdir()):
        return
    if _is_within(Path.cwd().resolve(), real) or real == Path.home().resolve():
        raise CheckpointError(
            f"destination {str(dst)!r} is the home directory or holds the current directory; "
            f"refusing to replace it. Choose a new output directory."
        )
    if not force:
        raise CheckpointError(
            f"destination {str(dst)!r} is not empty; refusing to overwrite it. Choose a new "
            f"directory or pass --force to replace its contents."
        )
    foreign = _foreign_entries(dst)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise CheckpointError(
            f"destination {str(dst)!r} holds {shown}, which are not draft checkpoint files; "
            f"--force replaces only a checkpoint directory (config.json, *.safetensors, "
            f"train_report.json). Move those away or choose a new directory."
        )


def write_checkpoint(dst: str | os.PathLike[str], config: Mapping[str, Any],
                     tensors: Mapping[str, torch.Tensor], force: bool = False,
                     sources: Sequence[str | os.PathLike[str] | None] = ()) -> Path:
    """Write ``config.json`` + ``model.safetensors`` into ``dst`` atomically.

    ``sources`` (input checkpoint, target) are paths ``dst`` must neither be nor hold;
    see :func:`check_destination`.
    """
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    dst = Path(dst).absolute()
    check_destination(dst, force, sources)
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=_scratch_prefix(dst, "tmp"), dir=dst.parent))
    except OSError as exc:
        raise CheckpointError(
            f"cannot create {dst}: {exc.strerror or exc} ({exc.filename or dst.parent}). Check "
            f"that {dst.parent} exists and is writable, or choose another output directory."
        ) from None
    try:
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        # safetensors refuses shared or non-contiguous storage: give each tensor its own.
        flat = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
        save_file(flat, str(tmp / SAFETENSORS_NAME), metadata={"format": "pt"})
        _default_permissions(tmp)
        _replace_dir(tmp, dst)
    except (OSError, SafetensorError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(
            f"writing {dst} failed ({exc}); nothing was written and what was at {dst} is "
            f"unchanged. Free space or fix permissions in {dst.parent}, or choose another "
            f"output directory."
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("wrote %s (%d tensors)", dst, len(tensors))
    return dst


def _scratch_prefix(dst: Path, kind: str) -> str:
    """``.DST.tmp-PID@HOST-`` (new files) or ``.DST.old-PID@HOST-`` (the replaced checkpoint)."""
    return f".{dst.name}.{kind}-{os.getpid()}@{socket.gethostname()}-"


def _writer_alive(pid: int, host: str) -> bool:
    if host != socket.gethostname():
        return True  # another machine's writer (a shared filesystem): cannot tell, keep it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _sweep_dead_writes(dst: Path) -> None:
    """Remove the temporary dirs of killed writes to ``dst``; keep what a live writer uses.

    A ``.tmp-`` dir is an unfinished new checkpoint and is deleted. An ``.old-`` dir is the
    checkpoint a killed write was replacing: it is never deleted, only reported (and moved
    back when ``dst`` itself is gone, i.e. the kill came between the two renames).
    """
    pattern = re.compile(rf"^\.{re.escape(dst.name)}\.(tmp|old)-(\d+)@(.+)-[^-]+$")
    try:
        entries = list(dst.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        m = pattern.match(entry.name)
        if not m or entry.is_symlink() or not entry.is_dir():
            continue
        kind, pid, host = m.group(1), int(m.group(2)), m.group(3)
        if _writer_alive(pid, host):
            continue
        if kind == "tmp":
            shutil.rmtree(entry, ignore_errors=True)
            logger.warning("removed %s, left by a write to %s that was killed (pid %d)",
                           entry, dst, pid)
        elif not dst.exists():
            os.rename(entry, dst)
            logger.warning("restored %s from %s: a write that was replacing it was killed "
                           "(pid %d) before the new checkpoint was in place", dst, entry, pid)
        else:
            logger.warning("%s holds the checkpoint a killed write (pid %d) replaced at %s; "
                           "delete it if you do not need it", entry, pid, dst)


def _default_permissions(tmp: Path) -> None:
    """mkdtemp makes the directory private (0700); give it the usual umask permissions."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    for f in tmp.iterdir():
        os.chmod(f, 0o666 & ~umask)


def _replace_dir(tmp: Path, dst: Path) -> None:
    """Move ``tmp`` to ``dst``; an existing ``dst`` is kept until the move succeeded."""
    if not dst.exists():
        os.rename(tmp, dst)
        return
    backup = Path(tempfile.mkdtemp(prefix=_scratch_prefix(dst, "old"), dir=dst.parent))
    backup.rmdir()
    os.rename(dst, backup)
    try:
        os.rename(tmp, dst)
    except BaseException:
        os.rename(backup, dst)
        raise
    shutil.rmtree(backup, ignore_errors=True)

