"""Copying a directory tree to a node over SFTP (`--sync`), modes kept."""

from __future__ import annotations

import os
import stat

import paramiko


def put_tree(client: paramiko.SSHClient, local_dir: str, remote_dir: str) -> int:
    """Copy `local_dir` to `remote_dir` (`~/` is the login directory); returns the number
    of files copied."""
    copied = 0
    with client.open_sftp() as sftp:
        remote_root = _sftp_path(sftp, remote_dir)
        _sftp_makedirs(sftp, remote_root)
        for root, dirs, files in os.walk(local_dir):
            rel = os.path.relpath(root, local_dir)
            target = remote_root if rel == "." else f"{remote_root}/{rel}"
            for name in dirs:
                _sftp_makedirs(sftp, f"{target}/{name}")
            for name in files:
                source = os.path.join(root, name)
                sftp.put(source, f"{target}/{name}")
                sftp.chmod(f"{target}/{name}", stat.S_IMODE(os.stat(source).st_mode))
                copied += 1
    return copied


def _sftp_path(sftp: paramiko.SFTPClient, path: str) -> str:
    if path.startswith("~/"):
        return f"{sftp.normalize('.')}/{path[2:]}"
    return path


def _sftp_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    parts = path.split("/")
    for end in range(1, len(parts) + 1):
        partial = "/".join(parts[:end])
        if not partial:
            continue
        try:
            sftp.stat(partial)
        except FileNotFoundError:
            sftp.mkdir(partial, mode=0o700)
