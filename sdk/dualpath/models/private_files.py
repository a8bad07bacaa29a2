"""Folders and files only this user can read: how every cache DualPath keeps on disk
(the converted-model store, the prefix pages, synthetic models) creates what it writes.

A converted entry holds the model's weights, and a prefix page the token ids of a
prompt someone sent: folders are 0700 and files 0600, whatever the umask. A file is
created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a temporary one under a random name),
so a name planted in a shared folder, a symbolic link above all, is never written
through. A store folder that is a symbolic link or belongs to another user is not
ours: it is skipped (listed, removed, pruned, written and read: never), and said so.
"""

from __future__ import annotations

import os
import stat
import tempfile

from ..errors import DualPathError

FOLDER_MODE = 0o700
FILE_MODE = 0o600
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) \
    | getattr(os, "O_BINARY", 0)


class UnsafeFolderError(DualPathError, PermissionError):
    """A cache folder that is a symbolic link or another user's: not used, not removed."""


def untrusted(path: str) -> str | None:
    """Why ``path`` must not be used as one of our cache folders (it is a symbolic link,
    not a folder, or another user's), or None when it is ours (or absent)."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"is a symbolic link (to {os.readlink(path)})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"belongs to another user (uid {st.st_uid}, this process runs as uid {os.geteuid()})"
    return None


def check_folder(path: str) -> None:
    """Raise UnsafeFolderError naming ``path`` and why it is not ours (``untrusted``)."""
    why = untrusted(path)
    if why:
        raise UnsafeFolderError(f"{path} {why}: not used (remove it, or choose another cache folder)")


def make_dirs(path: str) -> None:
    """Create ``path`` and its missing parents, each one this creates 0700 (an existing
    folder keeps its mode: the user may share it on purpose)."""
    path = os.path.abspath(path)
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, FOLDER_MODE)
        except FileExistsError:
            pass
        else:
            os.chmod(folder, FOLDER_MODE)  # the umask may have taken bits off; never added any


def private_folder(path: str) -> None:
    """Make folder ``path`` (0700) if absent; raise UnsafeFolderError when it is not ours.
    An older version's folder of ours is narrowed to 0700."""
    make_dirs(os.path.dirname(os.path.abspath(path)))
    try:
        os.mkdir(path, FOLDER_MODE)
    except FileExistsError:
        pass
    check_folder(path)
    narrow(path)


def narrow(folder: str) -> None:
    """Take the group's and others' bits off a folder of ours (made by an older version)."""
    try:
        if os.stat(folder, follow_symlinks=False).st_mode & 0o077:
            os.chmod(folder, FOLDER_MODE)
    except OSError:
        pass


def create(path: str, mode: str = "wb"):
    """A new file ``path`` (0600) opened for writing; FileExistsError when the name is
    taken, OSError (ELOOP) when it is a symbolic link: neither is ever written through."""
    fd = os.open(path, _CREATE, FILE_MODE)
    try:
        return os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8")
    except BaseException:
        os.close(fd)
        raise


def temporary(folder: str, prefix: str, suffix: str = "", mode: str = "wb"):
    """A new file (0600) in ``folder`` under an unpredictable name: (path, open file)."""
    fd, path = tempfile.mkstemp(suffix, prefix, folder)  # O_EXCL | O_NOFOLLOW, 0600
    try:
        return path, os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8")
    except BaseException:
        os.close(fd)
        raise


def temporary_folder(parent: str, prefix: str) -> str:
    """A new folder (0700) in ``parent`` under an unpredictable name."""
    return tempfile.mkdtemp("", prefix, parent)


def make_private(tree: str) -> None:
    """0700 on every folder and 0600 on every file of ``tree`` (ours: written just now
    into a folder of ours), before it is published; links are not followed."""
    for dirpath, _dirnames, filenames in os.walk(tree):
        os.chmod(dirpath, FOLDER_MODE)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.chmod(path, FILE_MODE)
