# pynox mount-namespace builder ("mounter"). Run as: python3 -I -S -c <this>
# with descriptor 3 a SOCK_SEQPACKET (or stream) Unix socket to the host.
#
# It is trusted and unconfined (it must run outside any Landlock domain:
# a Landlock-confined process can never mount), started by the host, and
# it serves one request per message: a JSON plan plus the descriptors the
# plan names (O_PATH descriptors the host opened when it accepted the
# request), and answers with a JSON reply plus two descriptors: the new
# user namespace and the new mount namespace.
#
# Per request it forks a builder child that, as real root in the host's
# namespaces, assembles the job's root as a detached mount tree (a small
# tmpfs, read-only once built, holding the host's top-level symlinks, the
# binds and the overlays at their paths: nothing is ever created or changed
# on the host), unshares a mount namespace, attaches the tree and
# pivot_roots into it, then unshares a user namespace with a new mount
# namespace (a copy, whose mounts become locked) that the parent maps
# (see MAP). The host keeps the two
# namespace descriptors; a capability-less root process of the host (a
# spare) can enter them (the owner of a user namespace holds every
# capability in it), must drop the capabilities it regains there, and then
# sees exactly the tree. The child exits; the descriptors keep the
# namespaces alive, and nothing the job can reach is ever touched by the
# builder: the tree exists before the job and is dropped with the
# descriptors.
#
# Prepared namespaces: a request {"op": "prepare", "n": n, <base plan>}
# gives the mounter the part of every namespace no request changes (it
# keeps the descriptors); it then keeps n namespaces built from it (their
# root tmpfs still writable) ready, each rebuilt in the background after
# one is taken, and a request {"op": "attach", <the job's binds, overlays
# and dirs>} attaches the job's mounts to one of them without a fork (see
# serve_attach). A request without "op" builds a whole namespace as
# above.
#
# Plan: {"binds": [{"fd": i, "path": "/data", "ro": true, "nodev": true}],
#        "overlays": [{"fd": i, "path": "/work", "limit": bytes}],
#        "links": [["lib", "usr/lib"], ...], "dirs": ["/srv/app"], "root": i}
# where "root", when present, is a detached tmpfs mount to clone as the
# root instead of a fresh tmpfs, and "slots", when present with it, is how
# many slot directories s0, s1, ... the host made in that tmpfs: each
# namespace's root is then a clone of a free slot (see SLOTS), never of
# the tmpfs's root.
# where "fd" indexes the descriptors sent with the plan.
import _signal
import array
import ctypes
import errno
import fcntl
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {"x86_64": dict(open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432, mount_setattr=442,
                     pivot_root=155, unshare=272),
      "aarch64": dict(open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432, mount_setattr=442,
                      pivot_root=41, unshare=97)}[os.uname().machine]
OPEN_TREE_CLONE = 1
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
AT_SYMLINK_NOFOLLOW = 0x100
AT_FDCWD = -100
O_CLOEXEC = 0o2000000
MOVE_MOUNT_F_EMPTY_PATH = 4
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6
MOUNT_ATTR_RDONLY = 1
MOUNT_ATTR_NOSUID = 2
MOUNT_ATTR_NODEV = 4
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 2
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
PR_SET_PDEATHSIG = 1
# The user namespace maps one id only, and one no file has: uid and gid 0
# inside are 4294967294 outside. The process entering it keeps its own
# (unmapped) ids, so that the capabilities it holds there until it drops
# them, or that anything else entering it would hold, apply to no inode of
# the host (capabilities over an inode need its owner mapped).
MAP = "0 4294967294 1"


class MountAttr(ctypes.Structure):
    _fields_ = [("set", ctypes.c_uint64), ("clr", ctypes.c_uint64), ("prop", ctypes.c_uint64),
                ("userns", ctypes.c_uint64)]


def sys_(name, *args):
    r = libc.syscall(NR[name], *args)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (name, os.strerror(e)))
    return r


def clone_tree(fd):
    return sys_("open_tree", fd, b"", OPEN_TREE_CLONE | AT_EMPTY_PATH | AT_RECURSIVE | O_CLOEXEC)


def set_attr(fd, flags, recursive, prop=0):
    ma = MountAttr(flags, 0, prop, 0)
    sys_("mount_setattr", fd, b"", AT_EMPTY_PATH | (AT_RECURSIVE if recursive else 0), ctypes.byref(ma),
         ctypes.sizeof(ma))


def bind_flags(b):
    """A bind's mount flags: always nosuid; read-only and nodev as its
    plan entry asks ("ro", "nodev")."""
    return (MOUNT_ATTR_NOSUID | (MOUNT_ATTR_RDONLY if b.get("ro") else 0) |
            (MOUNT_ATTR_NODEV if b.get("nodev") else 0))


def new_fs(fstype, opts):
    f = sys_("fsopen", fstype.encode(), 1)
    try:
        for k, v in opts:
            sys_("fsconfig", f, FSCONFIG_SET_STRING, k.encode(), v.encode(), 0)
        sys_("fsconfig", f, FSCONFIG_CMD_CREATE, None, None, 0)
        return sys_("fsmount", f, 1, 0)  # FSMOUNT_CLOEXEC
    finally:
        os.close(f)


def attach(src, dfd, path):
    sys_("move_mount", src, b"", dfd, path.encode(), MOVE_MOUNT_F_EMPTY_PATH)


def rel(path):
    """path's components (a tuple), checked; remembered for the paths
    seen most (a build looks up each base path several times)."""
    parts = REL.get(path)
    if parts is not None:
        return parts
    parts = tuple(p for p in path.split("/") if p)
    if not path.startswith("/") or not parts or any(p in (".", "..") for p in parts):
        raise ValueError("path %r: expected an absolute path without . or .. components" % path)
    if len(REL) >= 4096:
        REL.clear()
    REL[path] = parts
    return parts


REL = {}


def make_point(root, path, is_dir, dev=None):
    """Creates the mountpoint for path inside the detached root tmpfs,
    relative to its descriptor (never on the host). A component that is a
    symlink in the tree (one of the host's top-level links) is refused.
    dev, when given, is the root tmpfs's device: a directory on the way
    that is on another file system (a mount made before, a host
    directory) is refused, so that nothing is ever made outside the root
    tmpfs. Returns a descriptor of the parent directory, which the caller
    closes, and the last component. (Callers that make many mountpoints
    use point, with a cache of the directories on the way.)"""
    return point(root, path, is_dir, {}, dev, True)


def point(root, path, is_dir, cache, dev=None, own=False):
    """make_point's work, with the fewest system calls: the parent
    directory's descriptor it returns is cache's (or root itself), not
    to be closed, unless own (then a descriptor of its own, and cache is
    emptied)."""
    parts = rel(path)
    d = root
    try:
        for i, p in enumerate(parts):
            if i == len(parts) - 1:
                try:
                    if is_dir:
                        os.mkdir(p, 0o755, dir_fd=d)
                    else:
                        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=d))
                except FileExistsError:
                    pass
                if own:
                    d = os.dup(d)
                return d, p
            key = tuple(parts[:i + 1])
            n = cache.get(key)
            if n is None:
                try:
                    os.mkdir(p, 0o755, dir_fd=d)
                except FileExistsError:
                    pass
                n = os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=d)
                cache[key] = n
                if dev is not None and os.fstat(n).st_dev != dev:
                    raise OSError(errno.EXDEV, "%s: a mount or a host directory is on the way" % path)
            d = n
    finally:
        if own:
            for fd in cache.values():
                os.close(fd)
            cache.clear()


def forget(cache, path):
    """Drops the cached directories at or beneath path, on which a mount
    now sits (a descriptor opened before it names the directory under
    it)."""
    parts = rel(path)
    for key in [k for k in cache if k[:len(parts)] == parts]:
        os.close(cache.pop(key))


def fill(root, plan, fds, masters):
    """build's links, dirs and mounts in the detached root; on failure
    closes every mount it made that is not attached yet (the caller
    closes the root)."""
    for name, target in plan.get("links") or []:
        try:
            os.symlink(target, name, dir_fd=root)
        except FileExistsError:
            pass
    for path in plan.get("dirs") or []:
        os.close(make_point(root, path, True)[0])
    mounts = []  # (path, is_dir, detached mount)
    try:
        make_mounts(mounts, plan, fds, masters)
    except BaseException:
        for _, _, m in mounts:
            os.close(m)
        raise
    # Shallow paths first, so that a mount inside another one's path lands
    # on top of it. Each mount is closed once tried; on a failure the rest
    # are closed too.
    todo = list(mounts)
    cache = {}
    try:
        todo.sort(key=lambda x: len(rel(x[0])))
        while todo:
            path, is_dir, m = todo.pop(0)
            try:
                d, last = point(root, path, is_dir, cache)
                try:
                    attach(m, d, last)
                except OSError as e:
                    raise OSError(e.errno, "%s at %s" % (e.strerror, path)) from None
            finally:
                os.close(m)
            forget(cache, path)
            preempt_point()
    finally:
        for fd in cache.values():
            os.close(fd)
        for _, _, m in todo:
            os.close(m)


def make_mounts(mounts, plan, fds, masters):
    """Appends the plan's binds and overlays to mounts as detached
    mounts, (path, is_dir, mount), each as soon as it is made (the caller
    closes them)."""
    for i, b in enumerate(plan.get("binds") or []):
        if masters is not None:
            mfd, is_dir = masters[i]
            mounts.append((b["path"], is_dir, clone_tree(mfd)))
            continue
        fd = fds[b["fd"]]
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        m = clone_tree(fd)
        mounts.append((b["path"], is_dir, m))
        set_attr(m, bind_flags(b), True, MS_PRIVATE)  # see attach_job
    for o in plan.get("overlays") or []:
        fd = fds[o["fd"]]
        up = new_fs("tmpfs", [("size", str(o["limit"])), ("mode", "0755")])
        try:
            os.mkdir("upper", 0o755, dir_fd=up)
            os.mkdir("work", 0o755, dir_fd=up)
            m = new_fs("overlay", [("lowerdir", "/proc/self/fd/%d" % fd),
                                   ("upperdir", "/proc/self/fd/%d/upper" % up),
                                   ("workdir", "/proc/self/fd/%d/work" % up)])
        finally:
            os.close(up)
        mounts.append((o["path"], True, m))
        set_attr(m, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, False)


def build(plan, fds, ro_root=True, masters=None):
    """Runs in the builder child, as real root: returns the detached root
    (left writable without ro_root: a prepared namespace, whose root the
    mounter makes read-only when it attaches a job's mounts). masters,
    when given, holds for each of the plan's binds a (detached mount,
    is_dir) pair made once (see make_masters): the bind is a clone of it,
    its flags set already."""
    if plan.get("slot") is not None:
        # A clone of a slot directory of the host's tmpfs (a rule of a
        # Landlock domain holds it): no other live namespace uses it.
        root = sys_("open_tree", fds[plan["root"]], ("s%d" % plan["slot"]).encode(),
                    OPEN_TREE_CLONE | AT_RECURSIVE | O_CLOEXEC | AT_SYMLINK_NOFOLLOW)
    elif plan.get("root") is not None:
        # A clone of a tmpfs the host made earlier (a rule of a Landlock
        # domain may hold its root): mountpoints made in it are shared
        # with every namespace cloned from it.
        root = clone_tree(fds[plan["root"]])
    else:
        root = new_fs("tmpfs", [("size", "1m"), ("nr_inodes", "4096"), ("mode", "0755")])
    try:
        fill(root, plan, fds, masters)
        # The tmpfs itself (mountpoints and links) is read-only from now on;
        # the mounts on it keep their own flags.
        if ro_root:
            set_attr(root, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, False)
    except BaseException:
        os.close(root)  # an inline build runs in the mounter: nothing stays open
        raise
    return root


# Mountpoints made in a shared root (see "root" in the plan), which every
# namespace cloned from it sees, are removed once no namespace that used
# them is left, so that requests with ever new paths cannot fill its
# inodes (and so fail every later namespace of the pool). TREE mirrors
# the entries made there: a node is [live namespaces using it, {name:
# node}]; LIVE lists each live namespace's id with the nodes it uses. A
# node's count is never below a descendant's, so a node at zero is
# removed with everything beneath it. (The shared root holds nothing else
# but the host's top-level links, never in TREE.) After a "prepare", the
# base plan's entries hold one count for good (see serve_prepare).
TREE = [1, {}]
LIVE = []
NS_GET_MNTNS_ID = 0x8008B705  # _IOR(0xb7, 5, __u64)
LISTMOUNT = {"x86_64": 458, "aarch64": 458}[os.uname().machine]
LSMT_ROOT = 0xFFFFFFFFFFFFFFFF


def ns_id(fd):
    b = bytearray(8)
    fcntl.ioctl(fd, NS_GET_MNTNS_ID, b)
    return struct.unpack("Q", b)[0]


def ns_alive(nsid):
    """Whether the mount namespace with this id still exists (listmount
    of its root: ENOENT once it is gone)."""
    req = struct.pack("IIQQQ", 32, 0, LSMT_ROOT, 0, nsid)
    buf = (ctypes.c_uint64 * 1)()
    if libc.syscall(LISTMOUNT, req, buf, 1, 0) >= 0:
        return True
    return ctypes.get_errno() != errno.ENOENT


def shared_nodes(base, path):
    """The TREE nodes of path's entries in the shared root, up to the
    first that is missing or a symbolic link (nothing is followed), made
    as needed. One descriptor at a time: a path may be deep."""
    try:
        parts = rel(path)
    except ValueError:
        return []
    out = []
    node = TREE
    d = os.dup(base)
    try:
        for p in parts:
            try:
                st = os.stat(p, dir_fd=d, follow_symlinks=False)
            except OSError:
                break
            if stat.S_ISLNK(st.st_mode):
                break
            node = node[1].setdefault(p, [0, {}])
            out.append(node)
            if not stat.S_ISDIR(st.st_mode):
                break
            n = os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=d)
            os.close(d)
            d = n
    finally:
        os.close(d)
    return out


def remove_tree(parent, name):
    """Removes name (a file, or a directory and everything beneath it)
    from the directory parent, one descriptor at a time; gives up on an
    error (the entry stays)."""
    try:
        try:
            os.rmdir(name, dir_fd=parent)
            return
        except NotADirectoryError:
            os.unlink(name, dir_fd=parent)
            return
        except OSError as e:
            if e.errno != errno.ENOTEMPTY:
                return
        names = [name]
        cur = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    except OSError:
        return
    try:
        while names:
            ents = os.listdir(cur)
            if not ents:
                up = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
                os.close(cur)
                cur = up
                os.rmdir(names.pop(), dir_fd=cur)
                continue
            e = ents[0]
            try:
                os.rmdir(e, dir_fd=cur)
                continue
            except NotADirectoryError:
                os.unlink(e, dir_fd=cur)
                continue
            except OSError as x:
                if x.errno != errno.ENOTEMPTY:
                    return
            n = os.open(e, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=cur)
            os.close(cur)
            cur = n
            names.append(e)
    except OSError:
        pass
    finally:
        os.close(cur)


def collect(base):
    """Removes, from the shared root base, what no live namespace uses
    (one a namespace still uses is never removed: that would detach its
    mount there)."""
    live = []
    for nsid, used in LIVE:
        if ns_alive(nsid):
            live.append((nsid, used))
        else:
            for node in used:
                node[0] -= 1
    LIVE[:] = live
    cur = os.dup(base)
    stack = [iter(list(TREE[1].items()))]
    parents = [TREE]
    try:
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                parents.pop()
                if stack:
                    up = os.open("..", os.O_PATH | os.O_DIRECTORY, dir_fd=cur)
                    os.close(cur)
                    cur = up
                continue
            name, kid = nxt
            if kid[0] <= 0:
                remove_tree(cur, name)
                del parents[-1][1][name]
            elif kid[1]:
                try:
                    n = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=cur)
                except OSError:
                    continue
                os.close(cur)
                cur = n
                stack.append(iter(list(kid[1].items())))
                parents.append(kid)
    finally:
        os.close(cur)


# Slots. With "slots" in a plan, SLOTS maps each slot directory's number
# to its state: absent, free; "busy", taken for a namespace being built;
# an int, the mount namespace id of the live namespace using it; "gone",
# its namespace failed or is gone and the slot is to be emptied. A slot is
# emptied (without following links, one descriptor at a time) and freed
# only once the namespace using it is gone, so no two live namespaces
# ever share a mountpoint name. A slot whose emptying fails stays out.
SLOTS = {}
SLOT_WAIT = 5.0  # seconds a request waits for a free slot


def slot_dir(base, i):
    return os.open("s%d" % i, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=base)


def collect_slots(base):
    """Frees the slots whose namespace is gone, emptying them."""
    for i, state in list(SLOTS.items()):
        if isinstance(state, int) and not ns_alive(state):
            state = SLOTS[i] = "gone"
        if state != "gone":
            continue
        try:
            d = slot_dir(base, i)
        except OSError:
            continue
        try:
            for name in os.listdir(d):
                remove_tree(d, name)
            if not os.listdir(d):
                del SLOTS[i]
        finally:
            os.close(d)


def take_slot(base, n, wait=SLOT_WAIT):
    """Takes a free slot of n (waiting up to wait seconds for a namespace
    to go); raises OSError when none is free."""
    waited = 0.0
    while True:
        collect_slots(base)
        for i in range(n):
            if i not in SLOTS:
                SLOTS[i] = "busy"
                return i
        if waited >= wait:
            raise OSError(errno.EBUSY, "no free namespace slot: all %d are used by live namespaces" % n)
        select.select([], [], [], 0.02)
        waited += 0.02


def slotted(plan):
    return plan.get("root") is not None and isinstance(plan.get("slots"), int) and plan["slots"] > 0


def private_copy_at_tmp(root):
    """Unshares a copy of the current mount namespace, makes every mount
    in it private, attaches the detached tree root at /tmp and makes it
    the working directory (for pivot_here)."""
    sys_("unshare", CLONE_NEWNS)
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount(/, MS_REC|MS_PRIVATE)")
    attach(root, AT_FDCWD, "/tmp")
    os.chdir("/tmp")


def pivot_here():
    """Makes the working directory the namespace's root and detaches the
    old root."""
    sys_("pivot_root", b".", b".")
    if libc.umount2(b".", MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), "umount2(old root)")


def child(plan, fds, w, r, ro_root=True, masters=None, seed=None):
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    root = build(plan, fds, ro_root, masters)
    if seed is not None:
        # The first namespace is a copy of the seed's (one mount, see
        # make_seed), not of the host's: less to copy and to tear down.
        if libc.setns(seed, CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "setns into the seed namespace")
        sys_("unshare", CLONE_NEWNS)
        attach(root, AT_FDCWD, "/t")
        os.chdir("/t")
    else:
        private_copy_at_tmp(root)
    pivot_here()
    os.chdir("/")
    sys_("unshare", CLONE_NEWUSER | CLONE_NEWNS)
    os.write(w, b"u")  # map me
    os.read(r, 1)      # the parent holds the namespaces: done


def serve_one(plan, fds):
    """Returns the reply, the descriptors to send with it, and a function
    that lets the builder child exit and reaps it: called after the reply
    is sent, as tearing down the child's first mount namespace waits for
    the kernel (RCU grace periods) and the host need not. With a shared
    root, the mountpoints of namespaces gone are removed first, and the
    new namespace's are counted."""
    if plan.get("root") is None:
        return serve_build(plan, fds)
    base = fds[plan["root"]]
    if slotted(plan):
        plan = dict(plan, slot=take_slot(base, plan["slots"]))
        reply, out, reap = serve_build(plan, fds)
        SLOTS[plan["slot"]] = "gone"
        if out:
            try:
                SLOTS[plan["slot"]] = ns_id(out[1])
            except OSError:
                SLOTS[plan["slot"]] = "busy"  # no id (an older kernel): kept for good
        return reply, out, reap
    collect(base)
    reply, out, reap = serve_build(plan, fds)
    # What the build made (or found) in the shared root, failed or not:
    # a failed build's entries are removed at the next request.
    used = {}
    for path in [m["path"] for m in (plan.get("binds") or []) + (plan.get("overlays") or [])] + (plan.get("dirs") or []):
        for node in shared_nodes(base, path):
            used[id(node)] = node
    used = list(used.values())
    if out:
        for node in used:
            node[0] += 1
        try:
            LIVE.append((ns_id(out[1]), used))
        except OSError:
            pass  # no id (an older kernel): its entries are kept for good
    return reply, out, reap


def spawn(plan, fds, ro_root=True, idle=False, masters=None, seed=None):
    """Forks a builder child for plan; returns its pid, the pipe it says
    "u" (map me) or "e<error>" on, and the pipe whose closing lets it
    exit. With idle, the child runs at nice BUILD_NICE (see start_pending)."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        PREEMPT[0] = False  # a builder child serves no request
        try:
            os.close(r1)
            os.close(w2)
            if idle:
                os.setpriority(os.PRIO_PROCESS, 0, BUILD_NICE)
            child(plan, fds, w1, r2, ro_root, masters, seed)
        except BaseException as e:  # noqa: BLE001
            try:
                os.write(w1, b"e" + str(e).encode()[:3000])
            except OSError:
                pass
            code = 1
        os._exit(code)
    os.close(w1)
    os.close(r2)
    return pid, r1, w2


def write_maps(pid):
    """Maps the builder child's user namespace (see MAP): one open and
    one write a file, no buffered file object."""
    for f in ("uid_map", "gid_map"):
        fd = os.open("/proc/%d/%s" % (pid, f), os.O_WRONLY | os.O_CLOEXEC)
        try:
            if os.write(fd, MAP.encode()) != len(MAP):
                raise OSError(errno.EIO, "short write to %s" % f)
        finally:
            os.close(fd)


def serve_build(plan, fds):
    pid, r1, w2 = spawn(plan, fds)

    def reap():
        os.close(w2)
        os.close(r1)
        os.waitpid(pid, 0)
    try:
        msg = os.read(r1, 4096)
        if not msg.startswith(b"u"):
            return {"error": msg[1:].decode(errors="replace") or "the builder died"}, [], reap
        write_maps(pid)
        return {"ok": True}, [os.open("/proc/%d/ns/user" % pid, os.O_RDONLY | os.O_CLOEXEC),
                              os.open("/proc/%d/ns/mnt" % pid, os.O_RDONLY | os.O_CLOEXEC)], reap
    except OSError as e:
        return {"error": str(e)}, [], reap


# Prepared namespaces. After a "prepare" request (the request-independent
# base plan: runtime and system paths, devices, /proc, the host's links,
# the working directory, and "root" in a pool with a shared root), the
# mounter keeps BASE["n"] namespaces built from it in STOCK, each with its
# root tmpfs still writable, built inline (see INLINE) or by builder
# children it forks in the background (one at a time, PENDING) while it
# waits for requests. An
# "attach" request (the job's binds, overlays and dirs) takes one out of
# the stock (or waits for one being built) and, without a fork, attaches
# the job's mounts to it: detached clones made here, in the mounter's own
# mount namespace, then setns into the prepared mount namespace (real
# root in the initial user namespace holds every capability over it),
# mountpoints made relative to its root without following links and
# never off the root tmpfs, move_mount, the root made read-only, setns
# back. A namespace an attach failed on is dropped, never handed out,
# and no namespace is ever handed out twice.
BASE = None     # {"plan": plan, "fds": [descriptors it names], "n": stock size}
STOCK = []      # [{"user": fd, "mnt": fd, "live": LIVE entry or None}]
PENDING = None  # {"pid", "r", "w"}: the builder child filling the stock
ZOMBIES = []    # builder children let go, to reap
LAST_ERR = ""   # why the last prepared build failed
PAUSED = False  # a prepared build failed: no more in the background
OWN_MNT = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]


def plan_paths(plan):
    """The paths a plan makes in the root (for the shared root's counts)."""
    return [m["path"] for m in (plan.get("binds") or []) + (plan.get("overlays") or [])] + (plan.get("dirs") or [])


def base_root():
    plan = BASE["plan"]
    return None if plan.get("root") is None else BASE["fds"][plan["root"]]


def serve_prepare(plan, fds):
    """Takes the base plan and its descriptors (kept for good)."""
    global BASE
    if BASE is not None:
        raise ValueError("the mounter is prepared already")
    n = plan.get("n")
    if not isinstance(n, int) or not 1 <= n <= 16:
        raise ValueError("prepare: n must be a number of namespaces from 1 to 16")
    if plan.get("overlays"):
        raise ValueError("prepare: a base plan has no overlays")
    for path in plan_paths(plan):
        rel(path)
    BASE = {"plan": plan, "fds": list(fds), "n": n}
    fds.clear()  # BASE's now
    BASE["masters"] = make_masters(plan, BASE["fds"])
    BASE["seed"] = make_seed()
    if base_root() is not None and not slotted(plan):
        # The base's entries in the shared root are never collected: a
        # namespace being built in the background uses them before any
        # count says so (removing one there would detach its mount).
        for path in plan_paths(plan):
            node = TREE
            for p in rel(path):
                node = node[1].setdefault(p, [0, {}])
                node[0] += 1
    return {"ok": True}, [], None


def make_masters(plan, fds):
    """The base binds' masters: for each, a detached recursive clone of
    its source, its flags (nosuid, read-only as asked) and its propagation
    (private: no later mount event of the host reaches it) set once, and
    whether it is a directory. A stock build then clones each master
    whole (one system call a bind: open_tree of a detached mount, Linux
    6.15 or later) instead of cloning the source, setting its flags and
    looking up its type; each clone is a new mount of that namespace's
    own, never shared with another. None where the kernel cannot clone a
    detached mount: the builds then take the sources as before."""
    out = []
    try:
        for b in plan.get("binds") or []:
            fd = fds[b["fd"]]
            m = clone_tree(fd)
            out.append((m, stat.S_ISDIR(os.fstat(fd).st_mode)))
            ma = MountAttr(bind_flags(b), 0, MS_PRIVATE, 0)
            sys_("mount_setattr", m, b"", AT_EMPTY_PATH | AT_RECURSIVE, ctypes.byref(ma), ctypes.sizeof(ma))
        if out:
            os.close(clone_tree(out[0][0]))
        return out
    except (OSError, ValueError, IndexError, TypeError):
        for m, _ in out:
            os.close(m)
        return None


def seed_child(w, r):
    root = new_fs("tmpfs", [("size", "4k"), ("nr_inodes", "4"), ("mode", "0755")])
    os.mkdir("t", 0o755, dir_fd=root)
    set_attr(root, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, False)
    private_copy_at_tmp(root)
    pivot_here()
    os.write(w, b"u")
    os.read(r, 1)


# The seed namespace's descriptor number (mountns.SeedFD): tools that
# count the mounter's namespaces leave it out. Not used when it is taken
# (or above the descriptor limit): builds then go without a seed.
SEED_FD = 1000


def make_seed():
    """The seed namespace, made once: a mount namespace of the initial
    user namespace whose one mount is a small read-only tmpfs holding an
    empty directory "t" (private, no other mount, nothing of the host). A
    stock build enters it, unshares a copy, attaches its tree at /t and
    pivot_roots into it, instead of copying the host's mount namespace
    and detaching all of it; the seed itself never changes (each build
    changes its own copy). Returns its descriptor, or None when it cannot
    be made (builds then start from a copy of the host's, as before)."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r1)
            os.close(w2)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            seed_child(w1, r2)
            code = 0
        except BaseException:  # noqa: BLE001
            pass
        os._exit(code)
    os.close(w1)
    os.close(r2)
    fd = None
    try:
        if os.read(r1, 1) == b"u":
            try:
                fcntl.fcntl(SEED_FD, fcntl.F_GETFD)
            except OSError as e:
                if e.errno != errno.EBADF:
                    raise
                n = os.open("/proc/%d/ns/mnt" % pid, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    fd = os.dup2(n, SEED_FD, inheritable=False)
                finally:
                    os.close(n)
    except OSError:
        fd = None
    finally:
        os.close(w2)
        os.close(r1)
        os.waitpid(pid, 0)
    return fd


# Inline stock builds. A stock namespace is built by the mounter itself,
# without forking a builder child (a fork of this process, the child's
# copy-on-write faults and its exit cost milliseconds of CPU per
# namespace): it builds the detached tree as a child would, enters the
# seed namespace, unshares a copy of it, attaches the tree and
# pivot_roots into it, then clones a "holder" that shares this process's
# memory (CLONE_VM: nothing is copied) and is created in a new user
# namespace with a new mount namespace: a copy of the one just made,
# whose mounts become locked there, as the builder child's second
# unshare makes them. The mounter enters its own mount namespace again
# at once (never serving from another), maps the holder's user namespace,
# opens its two namespaces and kills and reaps it. The holder runs no
# Python and touches nothing of ours: it runs the C library's sleep
# (INLINE_HOLD seconds) on a stack of its own, so that it goes away by
# itself even if the mounter is killed before it kills it. Where the C
# library has no clone, or an inline build fails at the clone for another
# reason than a resource (TRANSIENT), the stock is built by builder
# children as before (spawn). The holder starts with every signal
# blocked (our handlers are its handlers, our memory its memory), and a
# build that fails closes all it made (it runs in the mounter, which
# lives on).
INLINE = [True]
BUILDS = {"inline": 0, "forked": 0, "preempted": 0}  # stock builds made each way, requests served inside one (op "builds")
INLINE_HOLD = 10  # seconds a holder lives at most
PROC = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # the host's procfs, reached from a build's namespace
DROP = []  # mount namespaces a build made on its way, to drop while no request waits (drop_later)
HOLDERS = {}  # a stocked namespace's mount descriptor -> its holder's pid, killed, maybe not reaped yet
CLONE_VM = 0x100
HOLD_STACK = ctypes.create_string_buffer(64 << 10)
# A clone that fails for want of a resource (the pids cgroup full, memory,
# the user namespace count) fails that build only, as a fork would: it
# does not turn inline builds off.
TRANSIENT = (errno.EAGAIN, errno.ENOMEM, errno.ENOSPC, errno.EUSERS)
# Every signal, as plain numbers (signal's wrappers make an enum of each
# signal number at every call: some 0.4 ms for the whole set).
HOLD_MASK = _signal.valid_signals()
try:
    libc.clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    libc.clone.restype = ctypes.c_int
    HOLD_FN = ctypes.cast(libc.sleep, ctypes.c_void_p)
except AttributeError:
    INLINE[0] = False


def clone_holder():
    """Clones the holder (see INLINE) in a new user namespace and a new
    mount namespace copied from the current one; returns its pid."""
    top = ctypes.c_void_p(ctypes.addressof(HOLD_STACK) + ctypes.sizeof(HOLD_STACK) - 256)
    # The holder starts with every signal blocked (it inherits the mask):
    # sharing our memory and our signal handlers, it would otherwise run
    # Python's C-level handler on a signal (SIGINT: KeyboardInterrupt here).
    old = _signal.pthread_sigmask(signal.SIG_BLOCK, HOLD_MASK)
    try:
        pid = libc.clone(HOLD_FN, top, CLONE_VM | CLONE_NEWUSER | CLONE_NEWNS | signal.SIGCHLD,
                         ctypes.c_void_p(INLINE_HOLD))
        err = ctypes.get_errno()
    finally:
        _signal.pthread_sigmask(signal.SIG_SETMASK, old)
    if pid < 0:
        raise OSError(err, "clone of the namespace holder")
    return pid


def build_inline(plan, fds, masters, seed):
    """Builds a prepared namespace in this process (see INLINE); returns
    its user and mount namespace descriptors."""
    root = build(plan, fds, False, masters)
    try:
        preempt_point()  # the last before the seed: none until back home
        if libc.setns(seed, CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "setns into the seed namespace")
        pid = None
        try:
            sys_("unshare", CLONE_NEWNS)
            # The tree goes on top of the copy's root, where entering the
            # namespace lands (the topmost mount at its root), instead of
            # a pivot_root and a lazy unmount of the old root: the
            # unmount waited for the kernel (RCU) while a job's attach
            # waited for the mounter. This process's root becomes the
            # tree (the kernel gives no new user namespace to a process
            # whose root is not its mount namespace's). The copy is
            # dropped later, while no request waits (DROP).
            attach(root, AT_FDCWD, "/")
            os.fchdir(root)
            os.chroot(".")
            DROP.append(os.open("self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC, dir_fd=PROC))
            try:
                pid = clone_holder()
            except OSError as e:
                if e.errno not in TRANSIENT:
                    INLINE[0] = False  # builder children from now on
                raise
        finally:
            if libc.setns(OWN_MNT, CLONE_NEWNS) != 0:
                os._exit(3)  # never serve from a namespace of a build
    finally:
        os.close(root)
        trim_drop()  # builds served inside a refill add theirs too
    try:
        write_maps(pid)
        user = os.open("/proc/%d/ns/user" % pid, os.O_RDONLY | os.O_CLOEXEC)
        try:
            mnt = os.open("/proc/%d/ns/mnt" % pid, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(user)
            raise
    finally:
        # Reaped later (reap_zombies), and always before the namespace is
        # handed out (take_stocked): waiting here for the holder to be
        # scheduled and exit held up the mounter on a busy machine.
        os.kill(pid, signal.SIGKILL)
        ZOMBIES.append(pid)
    HOLDERS[mnt] = pid
    return user, mnt


def stock(user, mnt, slot):
    """Puts a namespace just built into the stock: its slot's state, or
    its counts in the shared root."""
    ns = {"user": user, "mnt": mnt, "live": None}
    root = base_root()
    if slot is not None:
        try:
            SLOTS[slot] = ns_id(mnt)
        except OSError:
            pass  # no id (an older kernel): the slot stays taken for good
    elif root is not None:
        used = {}
        for path in plan_paths(BASE["plan"]):
            for node in shared_nodes(root, path):
                used[id(node)] = node
        used = list(used.values())
        for node in used:
            node[0] += 1
        try:
            ns["live"] = (ns_id(mnt), used)
            LIVE.append(ns["live"])
        except OSError:
            pass  # no id (an older kernel): its entries are kept for good
    STOCK.append(ns)


def stock_inline(wait=SLOT_WAIT):
    """Builds one namespace inline and stocks it; on failure records why
    and pauses the background refill, as a failed builder child does.
    Returns False where inline builds cannot be used (the caller forks a
    builder child instead)."""
    global LAST_ERR, PAUSED
    if not INLINE[0] or BASE.get("seed") is None:
        return False
    plan = BASE["plan"]
    slot = None
    if slotted(plan):
        slot = take_slot(base_root(), plan["slots"], wait)
        plan = dict(plan, slot=slot)
    try:
        user, mnt = build_inline(plan, BASE["fds"], BASE.get("masters"), BASE["seed"])
    except Exception as e:  # noqa: BLE001 (a builder child reported any error: so does this)
        if slot is not None:
            SLOTS[slot] = "gone"
        if not INLINE[0]:
            return False  # the clone failed: a builder child tries
        LAST_ERR = str(e)
        PAUSED = True
        FAILED_AT[0] = time.monotonic()
        return True
    stock(user, mnt, slot)
    BUILDS["inline"] += 1
    PAUSED = False
    return True


def serve_builds(plan, fds):
    """Reports how many stock namespaces were built inline and by builder
    children; with "inline": false, builds by builder children from now
    on (the tests' way to the fork path)."""
    if plan.get("inline") is False:
        INLINE[0] = False
    return dict(BUILDS, ok=True, inline_on=INLINE[0], seed=BASE is not None and BASE.get("seed") is not None,
                dropping=len(DROP)), [], None


def start_pending(wait=SLOT_WAIT):
    global PENDING
    if stock_inline(wait):
        return  # built (or failed) at once: nothing pending
    if PENDING is not None:
        return  # a request served inside the failed build forked one: wait for it
    plan = BASE["plan"]
    if slotted(plan):
        plan = dict(plan, slot=take_slot(base_root(), plan["slots"], wait))
    # A stock namespace is built in the background, at a low priority: on
    # a busy machine its build (a fork, some 300 system calls, the
    # teardown of the builder's first namespace: milliseconds of CPU)
    # takes little CPU from the jobs and attaches running meanwhile. (Not
    # SCHED_IDLE: a builder starved while it holds the kernel's mount
    # lock would hold up every attach.) A request that must wait for it
    # raises it back (boost_pending).
    try:
        pid, r, w = spawn(plan, BASE["fds"], False, idle=True, masters=BASE.get("masters"), seed=BASE.get("seed"))
    except OSError:
        if plan.get("slot") is not None:
            SLOTS[plan["slot"]] = "gone"  # no namespace uses it: emptied and freed, never kept "busy"
        raise
    PENDING = {"pid": pid, "r": r, "w": w, "slot": plan.get("slot")}


def boost_pending():
    """Gives the pending builder child the normal priority back: a
    request waits for its namespace now."""
    try:
        os.setpriority(os.PRIO_PROCESS, PENDING["pid"], 0)
    except OSError:
        pass  # gone already: finish_pending reads its end


def finish_pending():
    """Waits for the pending builder child; stocks its namespace."""
    global PENDING, LAST_ERR, PAUSED
    pend, PENDING = PENDING, None
    try:
        msg = os.read(pend["r"], 4096)
        if not msg.startswith(b"u"):
            raise OSError(errno.EIO, msg[1:].decode(errors="replace") or "the builder died")
        pid = pend["pid"]
        write_maps(pid)
        user = os.open("/proc/%d/ns/user" % pid, os.O_RDONLY | os.O_CLOEXEC)
        try:
            mnt = os.open("/proc/%d/ns/mnt" % pid, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(user)
            raise
        stock(user, mnt, pend["slot"])
        BUILDS["forked"] += 1
        pend["slot"] = None
        PAUSED = False
    except OSError as e:
        LAST_ERR = str(e)
        PAUSED = True
        FAILED_AT[0] = time.monotonic()
    finally:
        if pend["slot"] is not None:
            SLOTS[pend["slot"]] = "gone"
        os.close(pend["w"])  # the child exits
        os.close(pend["r"])
        ZOMBIES.append(pend["pid"])


def refill():
    """Starts the next stock build when the stock is short; returns
    whether it is still short after an inline build (the main loop then
    polls without waiting, to build the next one when no request
    comes)."""
    if BASE is not None and PENDING is None and not PAUSED and len(STOCK) < BASE["n"]:
        if INLINE[0] and select.select([3], [], [], 0)[0]:
            return False  # a request first: an inline build would hold it up
        PREEMPT[0] = True
        try:
            start_pending(0)
        except OSError:
            return False  # no free slot now: an attach takes one when it needs it
        finally:
            PREEMPT[0] = False
        return PENDING is None and not PAUSED and len(STOCK) < BASE["n"]
    return False


def reap_zombies():
    for pid in list(ZOMBIES):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            ZOMBIES.remove(pid)
            for k in [k for k, v in HOLDERS.items() if v == pid]:
                del HOLDERS[k]


def drop_ns(ns):
    os.close(ns["user"])
    os.close(ns["mnt"])


# Leased namespaces. A request {"op": "lease"} takes a prepared namespace
# out of the stock, as an attach does, and hands its two descriptors to
# the host at once, with a lease number, before any job's mounts are in
# it: the host gives them to a ready spare, which enters the namespace,
# drops the capabilities it regains there and attaches its seccomp job
# layer while it waits for a job. The namespace holds only the base then
# (it is fresh from the stock, never a job's before). A request {"op":
# "attach", "lease": number, <the job's part>} then attaches the job's
# mounts to that namespace (the spare in it sees them: a process sees the
# mounts attached to its namespace later) and makes its root read-only,
# as an attach to a stocked namespace does; the lease ends with it,
# failed or not, so no namespace is ever attached to twice. {"op":
# "release", "lease": number} ends a lease whose spare never got a job.
# The host sends the spare its job only after the attach succeeded.
LEASES = {}      # lease number -> namespace (as in STOCK)
NEXT_LEASE = [1]
BUILD_NICE = 10  # a background build's nice value (start_pending)
MAX_LEASES = 256  # the host holds one per ready ns spare: a bound against leaks
LEASE_REBUILD = 0.2  # seconds between a lease's tries of a failed build
FAILED_AT = [0.0]  # time.monotonic() of the last failed prepared build


def take_stocked():
    """Takes a namespace out of the stock (waiting for one being built);
    returns it, or an error reply."""
    root = base_root()
    if slotted(BASE["plan"]):
        collect_slots(root)
    elif root is not None:
        collect(root)
    if not STOCK:
        if PENDING is None:
            start_pending()  # an inline build stocks it at once
        if PENDING is not None:
            boost_pending()
            finish_pending()
        if not STOCK:
            return None, {"error": "building a namespace: " + LAST_ERR}
    ns = STOCK.pop(0)
    reap_holder(ns["mnt"])
    return ns, None


def reap_holder(mnt):
    """Waits for the killed holder of the namespace whose mount
    descriptor is mnt, if it is not reaped yet: no namespace is handed
    out while its holder may live."""
    pid = HOLDERS.pop(mnt, None)
    if pid is not None and pid in ZOMBIES:
        ZOMBIES.remove(pid)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def serve_lease(plan, fds):
    """Leases a prepared namespace (see LEASES)."""
    if BASE is None:
        raise ValueError("lease: the mounter is not prepared")
    if len(LEASES) >= MAX_LEASES:
        raise ValueError("lease: %d namespaces are leased already" % MAX_LEASES)
    if not STOCK:
        # A lease never waits for a build: the mounter serves one request
        # at a time, and an attach (a job waiting) must not wait behind
        # it. The host asks again a little later; the build it waits for
        # runs at the normal priority from now on.
        # A build that failed (PAUSED) is tried again for a lease, at
        # most every LEASE_REBUILD seconds: a spare asking for a lease
        # gets one once a build succeeds again, instead of never (the
        # background refill stays paused).
        # An inline build (see INLINE) takes a fraction of a millisecond
        # and stocks its namespace at once: the lease takes it.
        if PENDING is None and (not PAUSED or time.monotonic() - FAILED_AT[0] >= LEASE_REBUILD):
            try:
                start_pending(0)
            except OSError:
                pass  # no free slot now
        if PENDING is not None:
            boost_pending()
        if not STOCK:
            return {"error": "lease: no prepared namespace is ready"}, [], None
    ns, err = take_stocked()
    if ns is None:
        return err, [], None
    n = NEXT_LEASE[0]
    NEXT_LEASE[0] += 1
    LEASES[n] = ns
    # The host gets copies: the mounter keeps its own until the attach.
    return {"ok": True, "lease": n}, [os.dup(ns["user"]), os.dup(ns["mnt"])], None


def serve_release(plan, fds):
    ns = LEASES.pop(plan.get("lease"), None)
    if ns is not None:
        drop_ns(ns)
    return {"ok": True}, [], None


def serve_attach(plan, fds):
    """Attaches the job's mounts to a prepared namespace: a leased one
    (plan["lease"]) or one out of the stock."""
    if BASE is None:
        raise ValueError("attach: the mounter is not prepared")
    root = base_root()
    if slotted(BASE["plan"]):
        root = None  # each namespace has a slot of its own: nothing shared to count
    lease = plan.get("lease")
    if lease is not None:
        ns = LEASES.pop(lease, None)
        if ns is None:
            raise ValueError("attach: no namespace is leased as %r" % (lease,))
        if root is not None:
            collect(root)
    else:
        ns, err = take_stocked()
        if ns is None:
            return err, [], None
    ok = False
    try:
        attach_job(ns["mnt"], plan, fds)
        ok = True
    finally:
        if root is not None:
            # What the attach made in the shared root, failed or not: a
            # failed attach's entries are removed at the next request.
            used = {}
            for path in plan_paths(plan):
                for node in shared_nodes(root, path):
                    used[id(node)] = node
            if ok and ns["live"] is not None:
                for node in used.values():
                    node[0] += 1
                ns["live"][1].extend(used.values())
        if not ok or lease is not None:
            drop_ns(ns)
    if lease is not None:
        return {"ok": True}, [], None  # the host and its spare hold the namespace
    return {"ok": True}, [ns["user"], ns["mnt"]], None


def serve_reattach(plan, fds):
    """Replaces the job's part a prepared namespace holds with another:
    {"op": "reattach", "ns": <the index of the namespace's mount
    descriptor among the request's>, "prev": [<the paths its part
    attached>], <the job's part>}. The host sends it for a namespace it
    had attached ahead (a job's part attached before the job came) when
    the job that came asks for other mounts: a ready ns spare entered it
    (no code of its job ran there; a namespace the host took back from an
    earlier one-shot job held that job, whose process is gone and which
    could change none of its mounts or its read-only root). The root is
    made writable, the mount at each path of prev is detached and the
    entries made for it removed (never one that is not on the root's own
    file system, nor one the base made), then the job's part
    is attached as "attach" attaches it, the root made read-only last.
    On an error the namespace may hold part of either, and no job may run
    in it."""
    if BASE is None:
        raise ValueError("reattach: the mounter is not prepared")
    if base_root() is not None and not slotted(BASE["plan"]):
        raise ValueError("reattach: the namespaces share their root")
    i = plan.get("ns")
    if type(i) is not int or not 0 <= i < len(fds):
        raise ValueError("reattach: expected the namespace's descriptor")
    prev = plan.get("prev")
    if not isinstance(prev, list) or not all(isinstance(p, str) for p in prev):
        raise ValueError("reattach: expected the paths attached before")
    mnt = fds[i]
    if ns_id(mnt) == ns_id(OWN_MNT):
        raise ValueError("reattach: not the mounter's own namespace")
    detach_job(mnt, prev)
    attach_job(mnt, plan, fds)
    return {"ok": True}, [], None


def detach_job(mnt, paths):
    """Detaches the mounts at paths in the namespace mnt, whose root it
    makes writable, and removes the entries made for them: the leaf and
    each directory above it left empty, on the root's file system only,
    never one of the base's own."""
    order = sorted(set(paths), key=lambda p: len(rel(p)), reverse=True)
    # The base's own entries (the working directory's empty directory,
    # say, where a job's grant was mounted) and those above them stay:
    # the namespace then shows what a fresh one does.
    keep = set()
    for p in plan_paths(BASE["plan"]):
        parts = rel(p)
        keep.update(parts[:k] for k in range(1, len(parts) + 1))
    if libc.setns(mnt, CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "setns into the namespace")
    try:
        root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            dev = os.fstat(root).st_dev
            ma = MountAttr(0, MOUNT_ATTR_RDONLY, 0, 0)
            sys_("mount_setattr", root, b"", AT_EMPTY_PATH, ctypes.byref(ma), ctypes.sizeof(ma))
            for path in order:
                if libc.umount2(("/" + "/".join(rel(path))).encode(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
                    e = ctypes.get_errno()
                    raise OSError(e, "umount2 %s: %s" % (path, os.strerror(e)))
            for path in order:
                remove_point(root, rel(path), dev, keep)
        finally:
            os.close(root)
    finally:
        if libc.setns(OWN_MNT, CLONE_NEWNS) != 0:
            os._exit(3)  # never serve from a job's namespace


def remove_point(root, parts, dev, keep=frozenset()):
    """Removes the entry at parts under root (a mountpoint whose mount is
    gone), then each directory above it that is left empty; it stops at
    the first entry that is not on dev (a mount), not empty, gone, or in
    keep (the base's: its components)."""
    for k in range(len(parts), 0, -1):
        if tuple(parts[:k]) in keep:
            return
        d = root
        try:
            for p in parts[:k - 1]:
                n = os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
                if d != root:
                    os.close(d)
                d = n
                if os.fstat(d).st_dev != dev:
                    return
            st = os.stat(parts[k - 1], dir_fd=d, follow_symlinks=False)
            if st.st_dev != dev:
                return
            if stat.S_ISDIR(st.st_mode):
                os.rmdir(parts[k - 1], dir_fd=d)
            elif k == len(parts) and stat.S_ISREG(st.st_mode):
                os.unlink(parts[k - 1], dir_fd=d)
            else:
                return
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EBUSY, errno.ENOENT, errno.EEXIST):
                return
            raise
        finally:
            if d != root:
                os.close(d)


def attach_job(mnt, plan, fds):
    mounts = []  # (path, is_dir, detached mount)
    try:
        # The job's binds are private, as the base's masters are: a clone
        # of a shared source is a peer of it, and a mount the host made
        # beneath the source later would reach the job's namespace with
        # its own flags (writable in a read-only mount).
        make_mounts(mounts, plan, fds, None)
        for path in plan_paths(plan):
            rel(path)
        if libc.setns(mnt, CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "setns into the prepared namespace")
        try:
            root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                dev = os.fstat(root).st_dev
                for path in plan.get("dirs") or []:
                    os.close(make_point(root, path, True, dev)[0])
                cache = {}
                try:
                    for path, is_dir, m in sorted(mounts, key=lambda x: len(rel(x[0]))):
                        try:
                            d, last = point(root, path, is_dir, cache, dev)
                        except OSError as e:
                            raise OSError(e.errno, "mountpoint %s: %s" % (path, e.strerror)) from None
                        try:
                            attach(m, d, last)
                        except OSError as e:
                            raise OSError(e.errno, "%s at %s" % (e.strerror, path)) from None
                        forget(cache, path)
                finally:
                    for fd in cache.values():
                        os.close(fd)
                set_attr(root, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, False)
            finally:
                os.close(root)
        finally:
            if libc.setns(OWN_MNT, CLONE_NEWNS) != 0:
                os._exit(3)  # never serve from a job's namespace
    finally:
        for _, _, m in mounts:
            os.close(m)


# What one request may carry: the plan's JSON, and its descriptors (the
# kernel's SCM_MAX_FD); the host checks both before it sends.
MAX_PLAN = 1 << 16
MAX_FDS = 253


def main():
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    sock = socket.socket(fileno=3)
    SOCK.append(sock)
    while True:
        reap_zombies()
        drop_later()
        more = refill()
        poller = select.poll()
        poller.register(3, select.POLLIN)
        if PENDING is not None:
            poller.register(PENDING["r"], select.POLLIN)
        ready = [fd for fd, _ in poller.poll(0 if more else 50 if ZOMBIES else None)]
        if PENDING is not None and PENDING["r"] in ready:
            finish_pending()
        if 3 not in ready:
            continue
        if not serve_request(sock):
            unmount_scratch()
            return  # the host closed the socket: it is gone


# The pool's own scratch tmpfs, when the pool confines itself: a Landlock
# domain refuses every change to the mount tree, so the pool cannot
# unmount it when it closes; the mounter, outside the domain, does when
# the host goes (end of file on its socket). {"op": "scratch", "path":
# path} with one descriptor, the tmpfs's root, is taken only as the
# host's first request (sent before the pool confines itself) and only
# when the path shows that descriptor's directory, a mount root; the
# mounter then unmounts nothing but that mount, and only while the path
# still shows it.
SCRATCH = []  # (path, descriptor of the tmpfs's root, kept: its file system's device number stays its own)
SERVED = [0]  # requests read so far
UMOUNT_NOFOLLOW = 8


def serve_scratch(plan, fds):
    path = plan.get("path")
    if SERVED[0] != 1 or SCRATCH or len(fds) != 1:
        raise ValueError("scratch: taken only once, as the first request, with one descriptor")
    if not isinstance(path, str) or not path.startswith("/") or os.path.normpath(path) != path:
        raise ValueError("scratch: expected a clean absolute path")
    st = os.fstat(fds[0])
    cur = os.stat(path, follow_symlinks=False)
    parent = os.stat(os.path.dirname(path), follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode) or (cur.st_dev, cur.st_ino) != (st.st_dev, st.st_ino) or parent.st_dev == st.st_dev:
        raise ValueError("scratch: the path does not show the descriptor's mount")
    root = fds.pop()  # kept (serve_request closes the rest)
    os.set_inheritable(root, False)
    SCRATCH.append((path, root))
    return {"ok": True}, [], None


def unmount_scratch():
    for path, root in SCRATCH:
        try:
            cur = os.stat(path, follow_symlinks=False)
            st = os.fstat(root)
        except OSError:
            continue
        if (cur.st_dev, cur.st_ino) == (st.st_dev, st.st_ino):
            libc.umount2(path.encode(), MNT_DETACH | UMOUNT_NOFOLLOW)


def serve_request(sock):
    """Reads one request from the host, serves it and sends the reply;
    returns False when the host has closed the socket."""
    fdarr = array.array("i")
    msg, anc, flags, _addr = sock.recvmsg(MAX_PLAN, socket.CMSG_SPACE(MAX_FDS * fdarr.itemsize))
    if not msg:
        return False  # the host closed the socket: it is gone
    for level, typ, data in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            fdarr.frombytes(data[:len(data) - len(data) % fdarr.itemsize])
    fds = list(fdarr)
    SERVED[0] += 1
    reap = None
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            # Part of the plan or of its descriptors was cut off.
            raise ValueError("the plan is over %d bytes or %d descriptors" % (MAX_PLAN, MAX_FDS))
        plan = json.loads(msg)
        op = plan.get("op")
        if op == "prepare":
            reply, out, reap = serve_prepare(plan, fds)
        elif op == "attach":
            reply, out, reap = serve_attach(plan, fds)
        elif op == "lease":
            reply, out, reap = serve_lease(plan, fds)
        elif op == "release":
            reply, out, reap = serve_release(plan, fds)
        elif op == "reattach":
            reply, out, reap = serve_reattach(plan, fds)
        elif op == "builds":
            reply, out, reap = serve_builds(plan, fds)
        elif op == "scratch":
            reply, out, reap = serve_scratch(plan, fds)
        elif op is None:
            reply, out, reap = serve_one(plan, fds)
        else:
            raise ValueError("unknown op %r" % op)
    except Exception as e:  # noqa: BLE001
        reply, out = {"error": "%s: %s" % (type(e).__name__, e)}, []
    finally:
        for fd in fds:
            os.close(fd)
    data = json.dumps(reply).encode()
    if out:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", out))])
        for fd in out:
            os.close(fd)
    else:
        sock.send(data)
    if reap is not None:
        reap()

    return True


# Preemption. A stock build that runs while no request waits (refill)
# serves, at points of its own (preempt_point: between two mounts of its
# tree, and before it enters the seed namespace, never between that and
# its return to the mounter's own), a request that came meanwhile before
# it goes on: a job's attach (on the job's path) used to wait for the
# whole build (a millisecond or more on a busy machine: most attaches
# came during one). A request served so builds, if it must, a namespace
# of its own without preemption; the build it interrupted keeps its
# slot and its detached tree, which nothing else sees.
PREEMPT = [False]
SOCK = []


DROP_MAX = 2  # build namespaces kept for later at most: more are dropped at once


def trim_drop():
    """Drops the oldest of DROP beyond DROP_MAX at once."""
    while len(DROP) > DROP_MAX:
        os.close(DROP.pop(0))


def drop_later():
    """Drops the namespaces builds made on their way (see build_inline),
    while no request waits: tearing one down waits for the kernel. More
    than DROP_MAX are dropped even while requests wait: a host whose
    requests come back to back (every one of them finding the next
    already sent) would otherwise pile them up, each a copy of a whole
    tree, until the mounter ran out of descriptors."""
    trim_drop()
    while DROP and not select.select([3], [], [], 0)[0]:
        os.close(DROP.pop())


def waits_for_stock():
    """Whether the request waiting on the socket takes a namespace out of
    the stock (an attach without a lease) while the stock is empty: it
    waits for the build under way, which it is not served inside (it
    would build a namespace of its own, and wait SLOT_WAIT for a slot the
    build holds when no other is free, then fail)."""
    if STOCK:
        return False
    try:
        plan = json.loads(SOCK[0].recv(MAX_PLAN, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        return plan.get("op") == "attach" and plan.get("lease") is None
    except (OSError, ValueError, AttributeError):
        return False  # served: its reply says what is wrong


def preempt_point():
    if PREEMPT[0] and SOCK and select.select([3], [], [], 0)[0]:
        PREEMPT[0] = False
        if waits_for_stock():
            # It stays first on the socket until this build is done: no
            # other request is served inside it (nor peeked again).
            return
        BUILDS["preempted"] += 1
        try:
            if not serve_request(SOCK[0]):
                unmount_scratch()  # in the mounter's own namespace (preempt_point is never called in another)
                raise SystemExit(0)  # the host is gone
        finally:
            PREEMPT[0] = True


main()
