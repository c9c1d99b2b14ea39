package checkpoint

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"github.com/stasis-ckpt/stasis/criu"
	"github.com/stasis-ckpt/stasis/cuda"
	"github.com/stasis-ckpt/stasis/internal/procmaps"
	"github.com/stasis-ckpt/stasis/internal/trace"
	"golang.org/x/sys/unix"
)

// The preflight is the first step of a process checkpoint: it looks at the
// tree before anything is locked, frozen or begun in the store, and plans
// the checkpoint from what the tree holds. It says which processes are
// CUDA processes (the driver's answer, not only a mapped libcuda), chooses
// the CRIU options the tree needs, each with the reason, and refuses, in
// one line that names the way out, a tree that the checkpoint could not
// take as it is. Each check is a function of the checks list: later checks
// (the jobs users start, GPU pauses, several GPUs) add themselves there.
//
// Options it sets by itself, because the tree holds what needs them and
// they change nothing else:
//   - file_locks: a process of the tree holds a file lock or lease
//     (a "lock:" line in /proc/PID/fdinfo). The restore takes the locks
//     again (it repeats the option: Meta.FileLocks).
//   - link_remap: an open or mapped file whose path is gone but which is
//     still linked under another name (glibc's named semaphores in
//     /dev/shm map a temporary file that is then linked as sem.NAME and
//     unlinked). CRIU links it as link_remap.N beside the old path; the
//     restore, or CRIU at once when the tree runs on, removes that link.
//   - ghost_limit: open or mapped files unlinked everywhere (ghost files,
//     such as PyTorch's shared-memory segments in /dev/shm) are copied
//     whole into the images, each up to CRIU's limit (1 MiB by default):
//     the limit is raised to the largest with a quarter more, in whole
//     MiB, up to criu.MaxGhostLimit, past which the tree is refused.
//   - ext_unix_sk: unix sockets of the tree connected to a peer outside
//     it, where that is safe (unixsockets.go).
//
// Refusals:
//   - a process that has libcuda mapped but never initialized CUDA (a
//     DataLoader worker forked from a CUDA process) and maps an NVIDIA
//     device it inherited: CRIU cannot dump that mapping ("Can't handle
//     non-regular mapping");
//   - any other mapping of a device (not /dev/zero), for the same reason;
//   - a ghost file larger than criu.MaxGhostLimit;
//   - unix sockets connected outside the tree that CRIU cannot dump
//     (unixsockets.go).
//
// The options the user must decide stay flags: --tcp-established (the
// peer sees the connection frozen, and it must not change meanwhile),
// --shell-job (the terminal is outside the tree), and --ext-unix-sk and
// --file-locks, which turn the options on whatever the tree holds.

// ErrRefused wraps a preflight's refusal: the tree holds what its
// checkpoint cannot take, and nothing was locked, frozen or stored.
var ErrRefused = errors.New("cannot checkpoint")

// Choice is a CRIU option a checkpoint used, and why.
type Choice struct {
	Option string `json:"option"`          // CRIU's name: file_locks, link_remap, ghost_limit, ext_unix_sk, ...
	Value  string `json:"value,omitempty"` // ghost_limit's bytes
	By     string `json:"by"`              // "preflight" (chosen from the tree) or "flag" (the user's)
	Why    string `json:"why,omitempty"`
}

// Plan is what the preflight found and chose.
type Plan struct {
	// CUDAPIDs are the processes the driver checkpoints; NotCUDAPIDs
	// have libcuda mapped but never initialized CUDA, and are CPU
	// processes (CRIU's alone).
	CUDAPIDs    []int `json:"cuda_pids,omitempty"`
	NotCUDAPIDs []int `json:"not_cuda_pids,omitempty"`
	// Options are the CRIU options beyond stasis's own, as chosen.
	Options []Choice `json:"options,omitempty"`
	// GhostBytes is what CRIU copies of ghost files into the images.
	GhostBytes int64 `json:"ghost_bytes,omitempty"`

	drv *cuda.Driver // loaded when a process has libcuda mapped
}

// preflight is one preflight under way: the tree, the options as they
// stand, the plan so far, and which processes are CUDA processes.
type preflight struct {
	tree []Process
	opts criu.Options
	plan *Plan
	cuda map[int]bool // the CUDA processes
}

// check is one check of the preflight. It may change p.opts (with a
// Choice saying why) or return a refusal (wrapping ErrRefused).
type check struct {
	name string
	run  func(p *preflight) error
}

// checks run in order: CUDA first (the others need to know which
// processes the driver checkpoints).
var checks = []check{
	{"cuda", checkCUDA},
	{"device mappings", checkDeviceMappings},
	{"files", checkFiles},
	{"unix sockets", checkUnixSockets},
	{"what no one can checkpoint", checkUncheckpointable},
}

// Preflight plans the checkpoint of tree with the options o (the user's
// flags): it returns the plan and the CRIU options to dump with, or why
// the tree cannot be checkpointed.
func Preflight(tree []Process, o criu.Options) (*Plan, criu.Options, error) {
	p := &preflight{tree: tree, opts: o, plan: &Plan{}, cuda: map[int]bool{}}
	for _, f := range []struct {
		on   bool
		name string
		flag string
	}{{o.FileLocks, "file_locks", "--file-locks"}, {o.ExtUnixSockets, "ext_unix_sk", "--ext-unix-sk"},
		{o.TCPEstablished, "tcp_established", "--tcp-established"}, {o.ShellJob, "shell_job", "--shell-job"}} {
		if f.on {
			p.plan.Options = append(p.plan.Options, Choice{Option: f.name, By: "flag", Why: f.flag})
		}
	}
	for _, c := range checks {
		if err := c.run(p); err != nil {
			return nil, o, err
		}
		trace.Mark("checkpoint: preflight: " + c.name)
	}
	return p.plan, p.opts, nil
}

// choose records an option the preflight turned on.
func (p *preflight) choose(option, value, why string) {
	p.plan.Options = append(p.plan.Options, Choice{Option: option, Value: value, By: "preflight", Why: why})
}

// name is "PID N (comm)" for a process of the tree.
func (p *preflight) name(pid int) string {
	for _, q := range p.tree {
		if q.PID == pid {
			return fmt.Sprintf("PID %d (%s)", pid, q.Comm)
		}
	}
	return fmt.Sprintf("PID %d", pid)
}

// checkCUDA asks the driver which processes with libcuda mapped are CUDA
// processes.
func checkCUDA(p *preflight) error {
	mapped := libcudaPIDs(p.tree)
	if len(mapped) == 0 {
		return nil
	}
	drv, err := cuda.Load()
	if err != nil {
		return fmt.Errorf("PID %d uses CUDA: %w", mapped[0], err)
	}
	p.plan.drv = drv
	cudaPIDs, notInit, err := cudaProcesses(drv, mapped)
	if err != nil {
		return err
	}
	p.plan.CUDAPIDs, p.plan.NotCUDAPIDs = cudaPIDs, notInit
	for _, pid := range cudaPIDs {
		p.cuda[pid] = true
	}
	return nil
}

// fileMappings returns the mappings of files of pid (whose path starts
// with "/").
func fileMappings(pid int) ([]procmaps.Mapping, error) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "maps"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []procmaps.Mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m, err := procmaps.Parse(sc.Text()); err == nil && strings.HasPrefix(m.Path, "/") {
			out = append(out, m)
		}
	}
	return out, sc.Err()
}

// mapFileStat stats the file a mapping of pid maps, through
// /proc/PID/map_files (root only).
func mapFileStat(pid int, m procmaps.Mapping) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Stat(filepath.Join("/proc", strconv.Itoa(pid), "map_files", fmt.Sprintf("%x-%x", m.Start, m.End)), &st)
	return st, err
}

// devZero is /dev/zero's device number: CRIU dumps mappings of it.
var devZero = unix.Mkdev(1, 5)

// deviceKind says what a mapping of a file of mode and rdev is to CRIU:
// "" for a file CRIU dumps (a regular file, /dev/zero) or may (AMD's
// /dev/kfd and /dev/dri nodes, which CRIU's amdgpu plugin handles where it
// is installed), "nvidia" for an NVIDIA device (by its path, /dev/nvidia*,
// or its driver's name in /proc/devices, names), "device" for any other
// device, which CRIU cannot dump either.
func deviceKind(path string, mode uint32, rdev uint64, names map[uint32]string) string {
	isChr, isBlk := mode&unix.S_IFMT == unix.S_IFCHR, mode&unix.S_IFMT == unix.S_IFBLK
	if !isChr && !isBlk || isChr && rdev == devZero {
		return ""
	}
	if p := strings.TrimSuffix(path, " (deleted)"); p == "/dev/kfd" || strings.HasPrefix(p, "/dev/dri/") {
		return ""
	}
	if strings.HasPrefix(strings.TrimSuffix(path, " (deleted)"), "/dev/nvidia") ||
		isChr && strings.HasPrefix(names[unix.Major(rdev)], "nvidia") {
		return "nvidia"
	}
	return "device"
}

// charDrivers reads the character devices' drivers from /proc/devices,
// by major number.
func charDrivers() map[uint32]string {
	names := map[uint32]string{}
	data, err := os.ReadFile("/proc/devices")
	if err != nil {
		return names
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "Block devices") {
			break
		}
		f := strings.Fields(line)
		if len(f) == 2 {
			if n, err := strconv.ParseUint(f[0], 10, 32); err == nil {
				names[uint32(n)] = f[1]
			}
		}
	}
	return names
}

// checkDeviceMappings refuses a tree with a process that maps a device
// CRIU cannot dump. The NVIDIA devices of a CUDA process are the driver's
// to release (its checkpoint does); the same mappings in a process that
// never initialized CUDA, inherited through fork from a CUDA process, stay.
func checkDeviceMappings(p *preflight) error {
	names := charDrivers()
	for _, proc := range p.tree {
		maps, err := fileMappings(proc.PID)
		if err != nil {
			continue // gone meanwhile; CRIU will say
		}
		for _, m := range maps {
			st, err := mapFileStat(proc.PID, m)
			if err != nil {
				continue
			}
			switch deviceKind(m.Path, st.Mode, st.Rdev, names) {
			case "nvidia":
				if p.cuda[proc.PID] {
					continue
				}
				return fmt.Errorf("%w: %s maps the NVIDIA device %s (at %#x) but is not a CUDA process: it was forked from one, and CRIU cannot dump that mapping; start such processes with spawn or forkserver (a PyTorch DataLoader: multiprocessing_context=\"spawn\" or \"forkserver\")",
					ErrRefused, p.name(proc.PID), strings.TrimSuffix(m.Path, " (deleted)"), m.Start)
			case "device":
				return fmt.Errorf("%w: %s maps the device %s (at %#x, %d:%d), which CRIU cannot dump",
					ErrRefused, p.name(proc.PID), strings.TrimSuffix(m.Path, " (deleted)"), m.Start, unix.Major(st.Rdev), unix.Minor(st.Rdev))
			}
		}
	}
	return nil
}

// heldFile is a file a process of the tree has open or mapped.
type heldFile struct {
	pid  int
	path string // as /proc shows it, " (deleted)" included
	st   unix.Stat_t
}

// checkFiles looks at the files the tree holds: locks (file_locks),
// files unlinked while held (link_remap, ghost_limit).
func checkFiles(p *preflight) error {
	shmem := internalShmemDev()
	seen := map[[2]uint64]bool{}
	var held []heldFile
	var lockWhy string
	for _, proc := range p.tree {
		fdDir := filepath.Join("/proc", strconv.Itoa(proc.PID), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil {
				continue
			}
			if lockWhy == "" {
				if kind := fdLock(proc.PID, fd.Name()); kind != "" {
					lockWhy = fmt.Sprintf("%s holds a %s lock on %s", p.name(proc.PID), kind, link)
				}
			}
			if !strings.HasPrefix(link, "/") {
				continue
			}
			var st unix.Stat_t
			if unix.Stat(filepath.Join(fdDir, fd.Name()), &st) != nil {
				continue
			}
			held = append(held, heldFile{proc.PID, link, st})
		}
		maps, _ := fileMappings(proc.PID)
		for _, m := range maps {
			if !strings.HasSuffix(m.Path, " (deleted)") {
				continue
			}
			if st, err := mapFileStat(proc.PID, m); err == nil {
				held = append(held, heldFile{proc.PID, m.Path, st})
			}
		}
	}
	if lockWhy != "" && !p.opts.FileLocks {
		p.opts.FileLocks = true
		p.choose("file_locks", "", lockWhy)
	}
	var linkWhy string
	var largest heldFile
	for _, h := range held {
		key := [2]uint64{h.st.Dev, h.st.Ino}
		if seen[key] || h.st.Mode&unix.S_IFMT != unix.S_IFREG || !strings.HasSuffix(h.path, " (deleted)") || criuKeepsAsMemory(h.path, h.st.Dev, shmem) {
			continue
		}
		seen[key] = true
		if h.st.Nlink > 0 {
			if linkWhy == "" {
				linkWhy = fmt.Sprintf("%s holds %s, unlinked there but linked elsewhere", p.name(h.pid), h.path)
			}
			continue
		}
		size := h.st.Blocks * 512
		p.plan.GhostBytes += size
		if size > largest.st.Blocks*512 {
			largest = h
		}
	}
	if linkWhy != "" && !p.opts.LinkRemap {
		p.opts.LinkRemap = true
		p.choose("link_remap", "", linkWhy)
	}
	if size := largest.st.Blocks * 512; size > 0 {
		limit := ghostLimit(size)
		if limit > criu.MaxGhostLimit {
			return fmt.Errorf("%w: %s holds %s, unlinked, of %d MiB: CRIU would copy it whole into the checkpoint, and stasis lets it copy at most %d MiB per file", ErrRefused, p.name(largest.pid), largest.path, size>>20, int64(criu.MaxGhostLimit)>>20)
		}
		if limit > defaultGhostLimit && limit > p.opts.GhostLimit {
			p.opts.GhostLimit = limit
			p.choose("ghost_limit", strconv.FormatInt(limit, 10), fmt.Sprintf("%s holds %s, unlinked, of %d KiB (CRIU copies such files up to %d KiB by default)", p.name(largest.pid), largest.path, size>>10, defaultGhostLimit>>10))
		}
	}
	return nil
}

// defaultGhostLimit is CRIU's own limit on ghost files.
const defaultGhostLimit = 1 << 20

// ghostLimit is the limit for a largest ghost file of size bytes: a
// quarter more (it may grow before the freeze), in whole MiB.
func ghostLimit(size int64) int64 {
	const mib = 1 << 20
	return (size + size/4 + mib - 1) / mib * mib
}

// criuKeepsAsMemory reports whether an unlinked file of path (as /proc
// shows it) on device dev is one CRIU dumps as memory, not as a file:
// anonymous shared memory, memfds and System V shared memory live on the
// kernel's internal shmem mount (device shmem), and anonymous hugetlb and
// AIO rings have names of their own.
func criuKeepsAsMemory(path string, dev, shmem uint64) bool {
	if shmem != 0 && dev == shmem {
		return true
	}
	for _, prefix := range []string{"/memfd:", "/SYSV", "/dev/zero", "/anon_hugepage", "/[aio]"} {
		if strings.HasPrefix(path, prefix) {
			return true
		}
	}
	return false
}

// internalShmemDev is the device of the kernel's internal shmem mount,
// as a shared anonymous mapping of this process shows it (CRIU finds it
// the same way); 0 when it cannot be found.
func internalShmemDev() uint64 {
	b, err := unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return 0
	}
	defer unix.Munmap(b)
	addr := uint64(uintptr(unsafe.Pointer(&b[0])))
	var st unix.Stat_t
	if unix.Stat(fmt.Sprintf("/proc/self/map_files/%x-%x", addr, addr+uint64(len(b))), &st) != nil {
		return 0
	}
	return st.Dev
}

// fdLock returns the kind of the first lock fdinfo lists for a file
// descriptor of pid ("POSIX WRITE", "FLOCK READ", "LEASE ..."), or "".
func fdLock(pid int, fd string) string {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "fdinfo", fd))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		rest, ok := strings.CutPrefix(line, "lock:")
		if !ok {
			continue
		}
		// "1: POSIX  ADVISORY  WRITE 1234 00:05:12 0 EOF"
		f := strings.Fields(rest)
		if len(f) >= 4 {
			return f[1] + " " + f[3]
		}
		return "file"
	}
	return ""
}

// checkUncheckpointable refuses what CRIU cannot take, before anything is
// locked: an io_uring (CRIU 4.1 stops on it, "Unknown shit 600
// (anon_inode:[io_uring])", after the GPU lock). A PyTorch job with an
// NCCL process group holds one (seen with NCCL 2.28), and the driver's
// checkpoint does not support NCCL communicators; NCCL's library alone is
// no sign of one: every PyTorch CUDA process maps it. The way out is the
// application path.
func checkUncheckpointable(p *preflight) error {
	const wayOut = "save the job's state from inside instead (stasis.save, or stasis.dcp under PyTorch's DCP), which the job resumes from"
	for _, proc := range p.tree {
		if what := ioUring(proc.PID); what != "" {
			return fmt.Errorf("%w: %s holds an io_uring (%s), which CRIU cannot dump (an NCCL process group opens one); %s", ErrRefused, p.name(proc.PID), what, wayOut)
		}
	}
	return nil
}

// ioUring names an io_uring process pid holds open or mapped, or is "".
func ioUring(pid int) string {
	fdDir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	fds, _ := os.ReadDir(fdDir)
	for _, fd := range fds {
		if link, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err == nil && link == "anon_inode:[io_uring]" {
			return "descriptor " + fd.Name()
		}
	}
	data, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "maps"))
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasSuffix(line, "[io_uring]") {
			return "mapped at " + strings.SplitN(line, "-", 2)[0]
		}
	}
	return ""
}
