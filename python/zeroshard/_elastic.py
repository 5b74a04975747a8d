"""_elastic.py - zeroshard-run's restart policy (--max-restarts, --min-ranks) and the records it is built on.

The launcher runs mpirun as a child, one attempt at a time, each with a folder of its own under the run
folder (`--run-dir`, else a temporary one). Each rank writes there (rank side, below):
  rank<R>.json   at start: host, pid, node (the forced node under ZS_FAKE_NODE_SIZE), whether it exec'd a program
  exit<R>.json   when it ends by itself: a normal exit, an uncaught exception, or a SIGTERM (written from a thread
                 woken by the signal's wakeup fd, so even a rank blocked in a C call records it at once)
  progress       rank 0: the last optimizer step completed;  first_step: when the attempt's first one completed
  saves.jsonl    rank 0: each checkpoint save that returned (so it is complete: `latest` is replaced last)
  loaded.json    rank 0: the checkpoint the script resumed from;  batch.json: the config's batch-size rule
A rank with a start record and no exit record died (kill -9, the OOM killer, a lost host); mpirun's own line
("mpirun noticed that process rank 2 ... exited on signal 9") names the first failure and its cause. The next
attempt runs on the ranks that remain (at least --min-ranks, and a world size the config's batch rule admits),
and the script resumes through its own resume path (load_checkpoint, resume_from_checkpoint, ckpt_path).
Each restart is one line on the launcher's output and one entry of zeroshard-restarts.json beside the
checkpoints. SIGTERM to the launcher is a preemption: forwarded to the ranks, never restarted.
"""
import atexit
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ATTEMPT_ENV = "ZEROSHARD_RUN_ATTEMPT_DIR"
LOG_NAME = "zeroshard-restarts.json"


# ------------------------------------------------------------------ rank side
class _Rank:
    dir = None
    rank = None
    exited = False
    progress_fd = None
    first_done = False
    preempt_mode = False    # a framework acts on SIGTERM at its next step (the Trainer: trainer_preemption)
    preempt_flag = False
    lock = threading.RLock()   # the SIGTERM handler may run in the main thread while it holds it


def _write(name, obj):
    """One record, written whole (a temporary file renamed into place)."""
    path = os.path.join(_Rank.dir, name)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _node(rank):
    fake = os.environ.get("ZS_FAKE_NODE_SIZE", "")
    return f"node {rank // int(fake)}" if fake.isdigit() and int(fake) > 0 else socket.gethostname()


def rank_started(rank, world, execs=False):
    """In a rank started by zeroshard-run: the start record; exit records from here on (not for a program this
    process is about to exec, which leaves only its start record and mpirun's word on how it ended)."""
    d = os.environ.get(ATTEMPT_ENV)
    if not d:
        return
    try:
        os.makedirs(d, exist_ok=True)   # on another host without a shared file system: a folder of its own
        _Rank.dir, _Rank.rank = d, rank
        _write(f"rank{rank}.json", {"rank": rank, "world": world, "host": socket.gethostname(),
                                    "node": _node(rank), "pid": os.getpid(), "exec": bool(execs)})
    except OSError as e:   # the records help the restart policy; a rank that cannot write them still trains
        print(f"zeroshard-run: rank {rank}: cannot write its record in {d}: {e}", file=sys.stderr)
        _Rank.dir = None
        return
    if execs:
        return
    atexit.register(rank_exit, "exited")
    _watch_sigterm()


def rank_exit(why):
    with _Rank.lock:   # whoever comes second waits until the record is written
        if _Rank.dir is None or _Rank.exited:
            return
        _Rank.exited = True
        try:
            _write(f"exit{_Rank.rank}.json", {"rank": _Rank.rank, "why": why, "time": time.time()})
        except OSError:
            pass


def _watch_sigterm():
    """SIGTERM (mpirun ending the job after a peer died, or a preemption) recorded the moment it arrives: the
    signal's wakeup fd wakes a thread, whatever the main thread is doing. The default action stays: the
    handler put in its place restores it and raises the signal again, unless the script installs its own."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:
        return

    def default_again(signum, frame):   # the record first: the thread may not have run yet
        rank_exit("SIGTERM")
        if _Rank.preempt_mode:
            _Rank.preempt_flag = True
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    signal.signal(signal.SIGTERM, default_again)

    def watch():
        while True:
            data = os.read(r, 64)
            if not data or signal.SIGTERM in data:
                _Rank.preempt_flag = _Rank.preempt_mode
                rank_exit("SIGTERM")
                return
    threading.Thread(target=watch, name="zeroshard-sigterm", daemon=True).start()


def trainer_preemption():
    """Under zeroshard-run, the HF Trainer takes SIGTERM as a preemption: at each optimizer step's end every
    rank votes (one zs_allreduce_sum); once any rank has had the signal, all of them set the Trainer's own
    should_save and should_training_stop there, so it writes checkpoint-N as at a save step and train()
    returns; the script goes on and exits 0. Until the first step ends, SIGTERM keeps its default effect.
    Patched on DefaultFlowCallback, which every Trainer has; nothing happens outside zeroshard-run."""
    mod = sys.modules.get("transformers.trainer_callback")
    if _Rank.dir is None or mod is None or getattr(mod.DefaultFlowCallback, "_zeroshard", False):
        return
    flow = mod.DefaultFlowCallback
    orig = flow.on_step_end

    def on_step_end(self, args, state, control, **kwargs):
        control = orig(self, args, state, control, **kwargs) or control
        if _vote_preempt():
            control.should_save = True
            control.should_training_stop = True
            if _Rank.rank == 0:
                print(f"zeroshard: preempted (SIGTERM): the Trainer saves checkpoint-{state.global_step} and stops",
                      file=sys.stderr, flush=True)
        return control
    flow.on_step_end = on_step_end
    flow._zeroshard = True


def _vote_preempt():
    """Collective: True on every rank once any rank has had SIGTERM (preempt mode starts at the first vote)."""
    import ctypes
    from ._exit import _engines
    live = [e for e in list(_engines) if e.ctx]
    if not live or _Rank.dir is None:
        return False
    _Rank.preempt_mode = True
    flag = (ctypes.c_double * 1)(1.0 if _Rank.preempt_flag else 0.0)
    from . import _lib as L
    L.check(live[0].lib.zs_allreduce_sum(live[0].ctx, flag, 1), "preemption vote")
    return flag[0] > 0


def step_done(step):
    """Rank 0, after each optimizer step: one pwrite."""
    if _Rank.dir is None or _Rank.rank != 0:
        return
    try:
        if _Rank.progress_fd is None:
            _Rank.progress_fd = os.open(os.path.join(_Rank.dir, "progress"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(_Rank.progress_fd, f"{int(step):>12d}\n".encode(), 0)
        if not _Rank.first_done:
            _Rank.first_done = True
            _write("first_step.json", {"step": int(step), "time": time.time()})
    except OSError:
        pass


def saved(save_dir, tag, step):
    if _Rank.dir is None or _Rank.rank != 0:
        return
    line = json.dumps({"dir": os.path.abspath(os.fspath(save_dir)), "tag": tag, "step": int(step),
                       "time": time.time()}) + "\n"
    try:
        with open(os.path.join(_Rank.dir, "saves.jsonl"), "a") as f:
            f.write(line)
    except OSError:
        pass


def loaded(load_dir, tag, step):
    if _Rank.dir is not None and _Rank.rank == 0:
        _write("loaded.json", {"dir": os.path.abspath(os.fspath(load_dir)), "tag": tag, "step": int(step),
                               "time": time.time()})


def batch_rule(config, micro, gas, world):
    """Rank 0: the config's batch-size keys as the script gave them, and the values they came to."""
    if _Rank.dir is None or _Rank.rank != 0:
        return
    given = {k: config[k] for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                    "gradient_accumulation_steps") if isinstance(config.get(k), int)}
    _write("batch.json", {"given": given, "micro": int(micro), "gas": int(gas), "world": int(world)})


# ------------------------------------------------------------------ launcher side
def fitting_worlds(rule, upto):
    """World sizes 1..upto the batch rule admits. A train_batch_size given with one of the micro-batch or
    accumulation keys is kept, the other derived (DeepSpeed's rule): the world must divide it. Without it, the
    global batch grows and shrinks with the world. With all three given, any world is tried: a caller that
    derives them (the HF Trainer fills them from its arguments) agrees again, a fixed file fails at start-up
    naming the keys."""
    given = (rule or {}).get("given", {})
    tbs = given.get("train_batch_size")
    if tbs is None or len(given) != 2:
        return list(range(1, upto + 1))
    per = given.get("train_micro_batch_size_per_gpu") or given.get("gradient_accumulation_steps")
    return [w for w in range(1, upto + 1) if tbs % (w * per) == 0]


_NOTICED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_FIRST_NAME = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]")
_FIRST_CODE = re.compile(r"Exit code:\s*(\d+)")
_LOST_DAEMON = re.compile(r"Remote daemon:.* on node (\S+)")


class MpirunWatch:
    """mpirun's standard error passed through line by line, and what it says about the first failure."""

    def __init__(self, stream, out):
        self.rank = self.signal = self.code = self.host = None
        self.lost_hosts = []
        self.noticed_at = None
        self._thread = threading.Thread(target=self._pump, args=(stream, out), daemon=True)
        self._thread.start()

    def _pump(self, stream, out):
        """Passed on as it comes (progress bars redraw with a carriage return, no newline), parsed by line."""
        try:
            fd = stream.fileno()
        except (OSError, ValueError, AttributeError):   # a text stream without a file (the launcher's checks)
            for line in stream:
                out.write(line)
                self.parse(line)
            return
        sink, rest = getattr(out, "buffer", None), b""
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            if sink is not None:
                sink.write(data)
                sink.flush()
            else:
                out.write(data.decode(errors="replace"))
                out.flush()
            *lines, rest = (rest + data).split(b"\n")
            for line in lines:
                self.parse(line.decode(errors="replace"))
            rest = rest[-4096:]
        if rest:
            self.parse(rest.decode(errors="replace"))

    def parse(self, line):
        m = _NOTICED.search(line)
        if m and self.rank is None:
            self.rank, self.host, self.signal = int(m[1]), m[2], int(m[3])
            self.noticed_at = time.time()
        m = _FIRST_NAME.search(line)
        if m and self.rank is None:
            self.rank = int(m[1])
            self.noticed_at = time.time()
        m = _FIRST_CODE.search(line)
        if m and self.code is None and self.signal is None:
            self.code = int(m[1])
        m = _LOST_DAEMON.search(line)
        if m and m[1] not in self.lost_hosts:
            self.lost_hosts.append(m[1])
            self.noticed_at = self.noticed_at or time.time()

    def join(self):
        self._thread.join(timeout=10)


def _read(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def _sig_name(n):
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


class Attempt:
    """What one attempt's folder and mpirun's output say after it ended."""

    def __init__(self, folder, world, watch):
        self.folder, self.world, self.watch = folder, world, watch
        self.ranks = {r: _read(os.path.join(folder, f"rank{r}.json")) for r in range(world)}
        self.exits = {r: _read(os.path.join(folder, f"exit{r}.json")) for r in range(world)}
        try:
            with open(os.path.join(folder, "progress")) as f:
                self.step = int(f.read().strip())
        except (OSError, ValueError):
            self.step = None
        self.saves = []
        try:
            with open(os.path.join(folder, "saves.jsonl")) as f:
                self.saves = [json.loads(x) for x in f if x.strip()]
        except (OSError, ValueError):
            pass
        self.loaded = _read(os.path.join(folder, "loaded.json"))
        self.first_step = _read(os.path.join(folder, "first_step.json"))
        self.batch = _read(os.path.join(folder, "batch.json"))

    def dead(self):
        """Ranks that died: mpirun's first failure when a signal ended it, and every rank that started under
        the Python launcher and left no exit record (a program it exec'd leaves none either way: only
        mpirun's word counts there), and the ranks of a host mpirun lost. A rank that ended by itself with an
        error (an uncaught exception, an exit code) did not die: its slot is kept, as torchrun keeps it."""
        dead = set()
        w = self.watch
        if w.rank is not None and w.signal is not None:
            dead.add(w.rank)
        for r, rec in self.ranks.items():
            if rec and not rec.get("exec") and self.exits.get(r) is None:
                dead.add(r)
        lost = set(w.lost_hosts)
        for r, rec in self.ranks.items():
            if rec and rec.get("host") in lost:
                dead.add(r)
        return sorted(dead)

    def cause(self, dead):
        w = self.watch
        parts = []
        named = sorted(set(dead) | ({w.rank} if w.rank is not None else set()))
        for r in named:
            rec = self.ranks.get(r) or {}
            where = ", ".join(x for x in (rec.get("node"), f"pid {rec['pid']}" if rec.get("pid") else None) if x)
            how = "died"
            if r == w.rank and w.signal is not None:
                how = f"killed by signal {w.signal} ({_sig_name(w.signal)})"
            elif r == w.rank and w.code is not None:
                why = (self.exits.get(r) or {}).get("why", "")
                how = f"exited with code {w.code}" + (f" ({why})" if why.startswith("uncaught") else "")
            elif self.ranks.get(r) and self.exits.get(r) is None:
                how = "vanished without an exit record (killed)"
            parts.append(f"rank {r}" + (f" ({where})" if where else "") + f" {how}")
        if w.lost_hosts:
            parts.append("lost host " + ", ".join(w.lost_hosts))
        nodes = {}
        for r, rec in self.ranks.items():
            if rec:
                nodes.setdefault(rec.get("node"), []).append(r)
        gone = [n for n, rs in nodes.items() if n and len(rs) > 1 and set(rs) <= set(dead)]
        if gone:
            parts.append("every rank of " + ", ".join(gone))
        return "; ".join(parts) or "the job failed (mpirun named no rank)"


def _parse_hosts(mpi):
    """(index of the -H/--host value or None, hosts with slots) from the mpirun options; a hostfile is read."""
    for i, a in enumerate(mpi[:-1]):
        if a in ("-H", "--host"):
            return i, [(h.partition(":")[0], h.partition(":")[2]) for h in mpi[i + 1].split(",")]
        if a in ("--hostfile", "-hostfile"):
            try:
                with open(mpi[i + 1]) as f:
                    lines = [ln.split("#")[0].strip() for ln in f]
            except OSError:
                return None, []
            return i, [(ln.split()[0], " ".join(ln.split()[1:])) for ln in lines if ln]
    return None, []


def drop_hosts(mpi, lost, folder):
    """The mpirun options without the lost hosts: -H rewritten, a hostfile copied without them into the run
    folder. Returns (options, hosts dropped)."""
    i, hosts = _parse_hosts(mpi)
    if i is None or not lost:
        return mpi, []
    keep = [(h, s) for h, s in hosts if h not in lost]
    dropped = [h for h, _ in hosts if h in lost]
    out = list(mpi)
    if mpi[i] in ("-H", "--host"):
        out[i + 1] = ",".join(h + (":" + s if s else "") for h, s in keep)
    else:
        path = os.path.join(folder, "hostfile")
        with open(path, "w") as f:
            f.writelines(f"{h} {s}".rstrip() + "\n" for h, s in keep)
        out[i + 1] = path
    return out, dropped


def _die_with_parent():
    """In mpirun, before exec: SIGTERM when the launcher dies (mpirun then ends its job). mpirun runs in a
    session of its own, so a signal to the launcher's process group (Ctrl-C, timeout, a job script's kill 0)
    reaches the launcher alone, which decides what the ranks get."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


_HF_CKPT = re.compile(r"^checkpoint-\d+$")


def _step_named(folder, step):
    """The folder that holds a save: its parent when the save's own folder is named for its step."""
    return os.path.dirname(folder) if re.search(rf"(?<!\d){int(step)}(?!\d)", os.path.basename(folder)) else folder


class Supervisor:
    def __init__(self, make_cmd, env, world, mpi, max_restarts, min_ranks, run_dir):
        self.make_cmd, self.env, self.world, self.mpi = make_cmd, env, world, mpi
        self.max_restarts, self.min_ranks = max_restarts, min_ranks
        self.own_dir = run_dir is None
        self.run_dir = os.path.abspath(run_dir) if run_dir else tempfile.mkdtemp(prefix="zeroshard-run-")
        os.makedirs(self.run_dir, exist_ok=True)
        self.preempted = None
        self.proc = None
        self.folder = None
        self.history = []
        self.saves = []

    def say(self, msg):
        print(f"zeroshard-run: {msg}", file=sys.stderr, flush=True)

    def _on_signal(self, signum, frame):
        """SIGTERM: a preemption, forwarded to this host's ranks (their own handlers save and exit 0); mpirun
        itself would kill them. Ranks elsewhere get it from the scheduler (scancel --signal=TERM). SIGINT goes
        to mpirun, which ends the job, as does SIGTERM before any rank of this host has started; either way
        there is no restart after."""
        self.preempted = _sig_name(signum)
        sent = 0
        if signum == signal.SIGTERM and self.folder:
            host = socket.gethostname()
            for r in range(self.world):
                rec = _read(os.path.join(self.folder, f"rank{r}.json"))
                if rec and rec.get("host") == host:
                    try:
                        os.kill(rec["pid"], signal.SIGTERM)
                        sent += 1
                    except (OSError, KeyError):
                        pass
        if not sent and self.proc is not None and self.proc.poll() is None:   # no rank of this host yet: mpirun
            try:
                self.proc.send_signal(signum)
            except OSError:
                pass

    def run(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, self._on_signal)
        attempt = 0
        while True:
            self.folder = os.path.join(self.run_dir, f"attempt{attempt}")
            os.makedirs(self.folder, exist_ok=True)
            env = dict(self.env)
            env.update({ATTEMPT_ENV: self.folder, "ZEROSHARD_RESTART_COUNT": str(attempt),
                        "TORCHELASTIC_RESTART_COUNT": str(attempt),
                        "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts)})
            cmd = self.make_cmd(self.world, self.mpi)
            started = time.time()
            if self.history:
                self.history[-1]["restarted_at"] = started
            self.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, bufsize=0, start_new_session=True,
                                         preexec_fn=_die_with_parent)
            watch = MpirunWatch(self.proc.stderr, sys.stderr)
            rc = self.proc.wait()
            watch.join()
            rc = rc if rc >= 0 else 128 - rc
            done = Attempt(self.folder, self.world, watch)
            self.saves += done.saves
            self._resumed(done)
            if rc == 0 or self.preempted:
                if self.preempted:
                    self.say(f"{self.preempted}: a preemption, not restarted; the job's exit status {rc}")
                self._write_log(final=True, rc=rc)
                self._cleanup(rc)
                return rc
            if not self._restart(done, attempt, rc):
                self._write_log(final=True, rc=rc)
                return rc
            attempt += 1

    def _resumed(self, done):
        """The restart before this attempt: what the script resumed from, and how long until it trained again."""
        if not self.history:
            return
        h = self.history[-1]
        if done.loaded:
            h["resumed_from"] = {"tag": done.loaded["tag"], "step": done.loaded["step"], "dir": done.loaded["dir"]}
            h["steps_lost"] = max(0, h["step_reached"] - done.loaded["step"]) if h["step_reached"] is not None else None
        elif h.get("restarted_at"):
            h["resumed_from"] = None
            h["steps_lost"] = h["step_reached"]
        if done.first_step:
            h["seconds_to_first_step"] = round(done.first_step["time"] - h["failed_at"], 2)

    def _restart(self, done, attempt, rc):
        dead = done.dead()
        cause = done.cause(dead)
        if attempt >= self.max_restarts:
            self.say(f"the job failed ({cause}; exit status {rc})" + (
                f"; not restarted: --max-restarts {self.max_restarts} used" if self.max_restarts else ""))
            return False
        if not any(done.ranks.values()):
            self.say(f"the job failed before any rank started ({cause}; exit status {rc}): not restarting")
            return False
        execs = any(rec.get("exec") for rec in done.ranks.values() if rec)
        if attempt > 0 and done.step is None and not execs:   # a program's steps are not recorded
            self.say(f"the restarted job failed before its first step ({cause}; exit status {rc}): not restarting "
                     "again, the cause would repeat")
            return False
        mpi, dropped = drop_hosts(self.mpi, done.watch.lost_hosts, self.folder)
        alive = self.world - len(dead)
        fits = [w for w in fitting_worlds(done.batch, alive) if w >= self.min_ranks]
        if not fits:
            why = f"{alive} rank(s) remain, under --min-ranks {self.min_ranks}"
            if alive >= self.min_ranks and done.batch:
                why = (f"{alive} rank(s) remain, and the config's batch keys {done.batch['given']} admit no world "
                       f"size from {self.min_ranks} to {alive}")
            self.say(f"the job failed ({cause}; exit status {rc}); not restarting: {why}")
            return False
        new = fits[-1]
        aside = self._set_aside()
        newest = self._newest_save(done.step, aside)
        lost = None if done.step is None else done.step - (newest["step"] if newest else 0)
        entry = {"restart": attempt + 1, "max_restarts": self.max_restarts, "cause": cause, "dead_ranks": dead,
                 "signal": done.watch.signal, "exit_code": done.watch.code if done.watch.signal is None else None,
                 "hosts_dropped": dropped, "set_aside": aside, "exit_status": rc, "world_before": self.world, "world_after": new,
                 "step_reached": done.step, "newest_checkpoint": newest, "steps_lost_expected": lost,
                 "failed_at": done.watch.noticed_at or time.time()}
        self.history.append(entry)
        ckpt = f"{newest['dir']}/{newest['tag']} (step {newest['step']})" if newest else "none (starts over)"
        step = "an unknown step" if done.step is None else f"step {done.step}"
        self.say(f"restart {attempt + 1}/{self.max_restarts}: {cause} at {step}; {self.world} -> {new} ranks"
                 + (f" (the batch rule admits {new}, not {alive})" if new != alive else "")
                 + f"; newest complete checkpoint {ckpt}; steps lost: {'unknown' if lost is None else lost}"
                 + (f"; set aside: {', '.join(aside)} (no trainer_state.json: the Trainer's save did not finish)"
                    if aside else ""))
        self.world, self.mpi = new, mpi
        self._write_log()
        return True

    def _newest_save(self, reached, aside=()):
        ok = [s for s in self.saves if (reached is None or s["step"] <= reached)
              and os.path.basename(s["dir"]) not in aside and os.path.isdir(s["dir"])]
        return ok[-1] if ok else None

    def log_dir(self):
        """Beside the checkpoints: the save folder, or the folder holding it when it is named for its step (the
        Trainer's checkpoint-N, Lightning's epoch=E-step=S.ckpt); the run folder when nothing was saved."""
        dirs = sorted({_step_named(s["dir"], s["step"]) for s in self.saves})
        if not dirs:
            return self.run_dir
        return dirs[0] if len(dirs) == 1 else os.path.commonpath(dirs)

    def _set_aside(self):
        """The Trainer writes checkpoint-N in place, its trainer_state.json last, and a restarted run_clm.py
        resumes from the highest N there is: a folder a death left without that file is renamed
        checkpoint-N.incomplete (kept, never deleted), so the resume takes the newest complete one."""
        if not any(_HF_CKPT.match(os.path.basename(s["dir"])) for s in self.saves):
            return []
        top, moved = self.log_dir(), []
        for name in sorted(os.listdir(top)):
            path = os.path.join(top, name)
            if not _HF_CKPT.match(name) or not os.path.isdir(path) or \
                    os.path.exists(os.path.join(path, "trainer_state.json")):
                continue
            dest, n = path + ".incomplete", 0
            while os.path.exists(dest):
                n += 1
                dest = f"{path}.incomplete.{n}"
            try:
                os.rename(path, dest)
                moved.append(name)
            except OSError as e:
                self.say(f"cannot set aside the incomplete {path}: {e}")
        return moved

    def _write_log(self, final=False, rc=None):
        doc = {"restarts": self.history, "run_dir": self.run_dir}
        if final:
            doc.update(finished=rc == 0, exit_status=rc, preempted=self.preempted, world_final=self.world)
        for d in {self.log_dir(), self.run_dir}:
            if not os.path.isdir(d):
                continue
            path = os.path.join(d, LOG_NAME)
            try:
                with open(path + ".tmp", "w") as f:
                    json.dump(doc, f, indent=1)
                os.replace(path + ".tmp", path)
            except OSError as e:
                self.say(f"cannot write {path}: {e}")

    def _cleanup(self, rc):
        """A temporary run folder of a job that ended cleanly without restarts goes; anything else is kept."""
        if self.own_dir and rc == 0 and not self.history:
            import shutil
            shutil.rmtree(self.run_dir, ignore_errors=True)
