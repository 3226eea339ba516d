"""Datasets held as whole tensors: synthetic, CIFAR-10 (python pickle format) and .npz.

Every loader returns the full training split as one inputs tensor and one labels tensor,
so a batch is a single ``index_select`` rather than a Python loop over samples. Images
stay uint8 in memory (4x smaller, 4x less to copy to a GPU) and are scaled to float on
the device, per batch, by :class:`InputTransform`.
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from orchestrator.trainer.exits import TrainerUsageError

CIFAR_DIR_NAME = "cifar-10-batches-py"
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
SYNTHETIC_CLASSES = 10
SYNTHETIC_FEATURES = 64
SYNTHETIC_TEST_SAMPLES = 1024
# Noise relative to the unit-variance class prototypes: classes overlap a little, so
# the loss falls steadily for a couple of hundred steps instead of collapsing at once.
# Images carry the class in 192 values (3x8x8, upscaled) rather than 64, so they get
# more noise for a comparable difficulty.
SYNTHETIC_NOISE = 2.0
SYNTHETIC_IMAGE_NOISE = 4.0
NPZ_KEYS = "x, y (training inputs and integer labels); optional x_test, y_test"


@dataclass(frozen=True)
class Split:
    """One split: ``inputs`` (N, *sample_shape), float32 or uint8; ``labels`` (N,) int64."""

    inputs: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class Dataset:
    name: str
    train: Split
    test: Split | None
    num_classes: int
    mean: tuple[float, ...] | None = None  # per-channel normalisation after scaling to [0, 1]
    std: tuple[float, ...] | None = None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.train.inputs.shape[1:])

    def identity(self) -> dict[str, object]:
        """What a checkpoint records to refuse resuming on different data."""
        return {
            "name": self.name,
            "train_samples": len(self.train),
            "sample_shape": list(self.sample_shape),
            "num_classes": self.num_classes,
        }

    def describe(self) -> str:
        shape = "x".join(map(str, self.sample_shape))
        test = f" / {len(self.test)} test" if self.test is not None else ", no test split"
        return f"{self.name} ({len(self.train)} train{test}, {shape}, {self.num_classes} classes)"


class InputTransform:
    """Turns a stored batch into model input on the device: uint8 -> [0, 1] -> normalised."""

    def __init__(self, dataset: Dataset, device: torch.device) -> None:
        self.scale = dataset.train.inputs.dtype == torch.uint8
        shape = (1, -1) + (1,) * (len(dataset.sample_shape) - 1)
        self.mean = self.std = None
        if dataset.mean is not None and dataset.std is not None:
            self.mean = torch.tensor(dataset.mean, device=device).view(shape)
            self.std = torch.tensor(dataset.std, device=device).view(shape)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale:
            x = x.float().div_(255.0)
        if self.mean is not None:
            x = (x - self.mean) / self.std
        return x


def load_dataset(
    name: str, path: Path | None, *, model: str, seed: int, synthetic_samples: int
) -> Dataset:
    """Load dataset ``name``; errors a user can fix raise TrainerUsageError."""
    if name == "synthetic":
        return make_synthetic(synthetic_samples, images=(model == "cnn"), seed=seed)
    if path is None:
        raise TrainerUsageError(f"--dataset {name} needs --data-path")
    if name == "cifar10":
        return load_cifar10(path)
    if name == "npz":
        return load_npz(path)
    raise TrainerUsageError(f"--dataset {name}: unknown; choose one of synthetic, cifar10, npz")


def make_synthetic(num_samples: int, *, images: bool, seed: int) -> Dataset:
    """Gaussian clusters around fixed random class prototypes, all drawn from ``seed``.

    Vectors of 64 features for the MLP; for the CNN, 3x32x32 images whose prototypes are
    8x8 random patterns upscaled 4x, so neighbouring pixels correlate as in real images.
    """
    gen = torch.Generator().manual_seed(seed)
    noise_scale = SYNTHETIC_IMAGE_NOISE if images else SYNTHETIC_NOISE
    if images:
        low = torch.randn(SYNTHETIC_CLASSES, 3, 8, 8, generator=gen)
        prototypes = low.repeat_interleave(4, dim=2).repeat_interleave(4, dim=3)
    else:
        prototypes = torch.randn(SYNTHETIC_CLASSES, SYNTHETIC_FEATURES, generator=gen)

    def draw(n: int) -> Split:
        labels = torch.randint(0, SYNTHETIC_CLASSES, (n,), generator=gen)
        noise = torch.randn((n, *prototypes.shape[1:]), generator=gen)
        # Divided by the noise scale so inputs have roughly unit variance.
        return Split((prototypes[labels] + noise_scale * noise) / noise_scale, labels)

    train = draw(num_samples)
    test = draw(SYNTHETIC_TEST_SAMPLES)
    return Dataset("synthetic", train, test, SYNTHETIC_CLASSES)


class _CifarUnpickler(pickle.Unpickler):
    """Loads the CIFAR batch pickles without letting them run arbitrary code."""

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected object {module}.{name}")


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with path.open("rb") as f:
            batch = _CifarUnpickler(f, encoding="bytes").load()
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
        images = data.reshape(-1, 3, 32, 32)  # rows are R(1024) G(1024) B(1024)
    except Exception as exc:  # any failure here means "not a CIFAR-10 batch file"
        raise TrainerUsageError(
            f"--data-path: {path} is not a CIFAR-10 python batch ({exc.__class__.__name__}: "
            f"{exc}); use the files from cifar-10-python.tar.gz"
        ) from None
    if len(images) != len(labels):
        raise TrainerUsageError(
            f"--data-path: {path} has {len(images)} images but {len(labels)} labels"
        )
    return images, labels


def load_cifar10(path: Path) -> Dataset:
    """CIFAR-10 from ``data_batch_N`` and ``test_batch`` pickles (no download, no torchvision).

    ``path`` is the ``cifar-10-batches-py`` directory or the directory that contains it.
    """
    if (path / CIFAR_DIR_NAME).is_dir():
        path = path / CIFAR_DIR_NAME
    batches = sorted(
        (p for p in path.iterdir() if re.fullmatch(r"data_batch_\d+", p.name)),
        key=lambda p: int(p.name.rsplit("_", 1)[1]),
    )
    if not batches:
        raise TrainerUsageError(
            f"--data-path {path}: no data_batch_1..5 files; pass the extracted "
            f"{CIFAR_DIR_NAME} directory from cifar-10-python.tar.gz"
        )
    parts = [_read_cifar_batch(p) for p in batches]
    train = Split(
        torch.from_numpy(np.concatenate([x for x, _ in parts])),
        torch.from_numpy(np.concatenate([y for _, y in parts])),
    )
    test = None
    if (path / "test_batch").is_file():
        x, y = _read_cifar_batch(path / "test_batch")
        test = Split(torch.from_numpy(x), torch.from_numpy(y))
    _check_labels(train, test, 10, f"--data-path {path}")
    return Dataset("cifar10", train, test, 10, CIFAR_MEAN, CIFAR_STD)


def load_npz(path: Path) -> Dataset:
    """Arrays from an .npz file: ``x`` (N, ...) and ``y`` (N,) integer labels, plus
    optional ``x_test``/``y_test``. uint8 inputs are scaled to [0, 1]; others become float32.
    """
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except Exception as exc:
        raise TrainerUsageError(
            f"--data-path {path}: cannot read as .npz ({exc.__class__.__name__}: {exc}); "
            f"expected arrays {NPZ_KEYS}"
        ) from None
    if "x" not in arrays or "y" not in arrays:
        raise TrainerUsageError(
            f"--data-path {path}: has arrays {sorted(arrays) or 'none'}; expected {NPZ_KEYS}"
        )
    train = _npz_split(path, arrays["x"], arrays["y"], "x", "y")
    test = None
    if "x_test" in arrays and "y_test" in arrays:
        test = _npz_split(path, arrays["x_test"], arrays["y_test"], "x_test", "y_test")
        if test.inputs.shape[1:] != train.inputs.shape[1:]:
            raise TrainerUsageError(
                f"--data-path {path}: x_test samples have shape {tuple(test.inputs.shape[1:])} "
                f"but x samples {tuple(train.inputs.shape[1:])}"
            )
    num_classes = int(max(train.labels.max(), test.labels.max() if test else 0)) + 1
    _check_labels(train, test, num_classes, f"--data-path {path}")
    return Dataset("npz", train, test, num_classes)


def _npz_split(path: Path, x: np.ndarray, y: np.ndarray, xk: str, yk: str) -> Split:
    where = f"--data-path {path}"
    if x.ndim < 2 or len(x) == 0:
        raise TrainerUsageError(f"{where}: '{xk}' must be (samples, features...), got {x.shape}")
    if y.ndim != 1 or len(y) != len(x):
        raise TrainerUsageError(
            f"{where}: '{yk}' must be one label per row of '{xk}': {y.shape} vs {x.shape}"
        )
    if not np.issubdtype(y.dtype, np.integer):
        raise TrainerUsageError(f"{where}: '{yk}' must hold integer class labels, got {y.dtype}")
    if not (x.dtype == np.uint8 or np.issubdtype(x.dtype, np.number)):
        raise TrainerUsageError(f"{where}: '{xk}' must be numeric, got {x.dtype}")
    inputs = x if x.dtype == np.uint8 else x.astype(np.float32, copy=False)
    return Split(
        torch.from_numpy(np.ascontiguousarray(inputs)),
        torch.from_numpy(y.astype(np.int64, copy=False)),
    )


def _check_labels(train: Split, test: Split | None, num_classes: int, where: str) -> None:
    for split in (train, test):
        if split is not None and (split.labels.min() < 0 or split.labels.max() >= num_classes):
            raise TrainerUsageError(
                f"{where}: labels must lie in 0..{num_classes - 1}, found "
                f"{int(split.labels.min())}..{int(split.labels.max())}"
            )
