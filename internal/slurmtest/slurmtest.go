// Package slurmtest starts a real one-node SLURM for tests: munged,
// slurmctld and slurmd (Debian's slurm-wlm and munge, which `make`
// installs), run as root in the foreground as children of the test, with
// their key, configuration, sockets, state and logs in a temporary
// directory and ports of their own, so that nothing of the machine's own
// SLURM or munge is used or touched. Where SLURM cannot start (not root,
// binaries missing, a daemon that exits or a node that never comes up) the
// test is skipped with the reason.
package slurmtest

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Node is the name of the one node.
const Node = "localhost"

// markerEnv marks every process of a cluster (daemons, slurmstepd, the
// jobs submitted through Command): at the end, whatever still runs with it
// is killed.
const markerEnv = "STASIS_SLURMTEST"

// Cluster is a running one-node SLURM.
type Cluster struct {
	// Dir holds everything of the cluster: slurm.conf, munge's key and
	// socket, state and spool directories, logs.
	Dir string
	// Conf is slurm.conf; commands find it through $SLURM_CONF.
	Conf    string
	t       *testing.T
	daemons []*daemon
}

type daemon struct {
	name   string
	cmd    *exec.Cmd
	log    string // its stdout and stderr
	exited chan struct{}
}

// Start starts munged, slurmctld and slurmd, waits for the node to be idle,
// and stops them all (and whatever they left) when the test ends.
func Start(t *testing.T) *Cluster {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SLURM's daemons need root")
	}
	for _, bin := range []string{"munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel", "sinfo"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed (Debian's slurm-wlm and munge provide SLURM; `make` installs them)", bin)
		}
	}
	dir, err := os.MkdirTemp("", "stasis-slurm-")
	if err != nil {
		t.Fatal(err)
	}
	// munged wants its socket's directory reachable by all.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{Dir: dir, Conf: filepath.Join(dir, "slurm.conf"), t: t}
	t.Cleanup(c.stop)
	for _, d := range []string{"munge", "state", "spool", "log"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o711); err != nil {
			t.Fatal(err)
		}
	}
	key := make([]byte, 1024)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "munge", "munge.key"), key, 0o400); err != nil {
		t.Fatal(err)
	}
	ports := freePorts(t, 2)
	if err := os.WriteFile(c.Conf, []byte(c.config(ports[0], ports[1])), 0o644); err != nil {
		t.Fatal(err)
	}

	m := filepath.Join(dir, "munge")
	c.start("munged", "munged", "--foreground", "--force", "--socket="+c.mungeSocket(),
		"--key-file="+filepath.Join(m, "munge.key"), "--log-file="+filepath.Join(m, "munged.log"),
		"--pid-file="+filepath.Join(m, "munged.pid"), "--seed-file="+filepath.Join(m, "munged.seed"))
	c.waitFor("munged's socket", func() bool {
		_, err := os.Stat(c.mungeSocket())
		return err == nil
	})
	c.start("slurmctld", "slurmctld", "-D", "-i", "-f", c.Conf)
	c.start("slurmd", "slurmd", "-D", "-N", Node, "-f", c.Conf)
	c.waitFor("node "+Node+" to be idle", func() bool {
		out, err := c.Command("sinfo", "-h", "-n", Node, "-o", "%t").Output()
		return err == nil && strings.TrimSpace(string(out)) == "idle"
	})
	return c
}

func (c *Cluster) mungeSocket() string { return filepath.Join(c.Dir, "munge", "munge.sock") }

// config is slurm.conf: one node of this machine's CPUs, one partition,
// no cgroups (proctrack/linuxproc, task/none), requeues allowed, finished
// jobs kept for scontrol for 5 minutes.
func (c *Cluster) config(ctldPort, dPort int) string {
	d := c.Dir
	return fmt.Sprintf(`ClusterName=stasistest
SlurmctldHost=%[1]s(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=%[2]d
SlurmdPort=%[3]d
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=%[4]s
StateSaveLocation=%[5]s/state
SlurmdSpoolDir=%[5]s/spool
SlurmctldPidFile=%[5]s/slurmctld.pid
SlurmdPidFile=%[5]s/slurmd.pid
SlurmctldLogFile=%[5]s/log/slurmctld.log
SlurmdLogFile=%[5]s/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
JobRequeue=1
MinJobAge=300
KillWait=5
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=%[1]s NodeAddr=127.0.0.1 CPUs=%[6]d State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
`, Node, ctldPort, dPort, c.mungeSocket(), d, runtime.NumCPU())
}

// freePorts finds n TCP ports free on 127.0.0.1 now.
func freePorts(t *testing.T, n int) []int {
	var ports []int
	var ls []net.Listener
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// Env is the environment of SLURM's commands (and of the jobs they
// submit): this process's, with the cluster's $SLURM_CONF and marker.
func (c *Cluster) Env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM_") && !strings.HasPrefix(kv, markerEnv+"=") {
			env = append(env, kv)
		}
	}
	return append(env, "SLURM_CONF="+c.Conf, markerEnv+"="+c.Dir)
}

// Command is a SLURM command (sbatch, scontrol, ...) for this cluster.
func (c *Cluster) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = c.Env()
	return cmd
}

// Run runs a SLURM command and returns its stdout, failing t when it
// fails.
func (c *Cluster) Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := c.Command(name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// Job is what `scontrol show job` says about a job: JobState, Reason,
// Restarts, ExitCode, ...
func (c *Cluster) Job(t testing.TB, id string) map[string]string {
	t.Helper()
	fields := map[string]string{}
	for _, f := range strings.Fields(c.Run(t, "scontrol", "show", "job", "-o", id)) {
		if k, v, ok := strings.Cut(f, "="); ok {
			fields[k] = v
		}
	}
	return fields
}

// WaitJob waits (at most timeout) until ok accepts the job's state, and
// returns it. It fails t when the job ends in a state ok does not accept.
func (c *Cluster) WaitJob(t testing.TB, id string, timeout time.Duration, what string, ok func(map[string]string) bool) map[string]string {
	t.Helper()
	var job map[string]string
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		job = c.Job(t, id)
		if ok(job) {
			return job
		}
		switch job["JobState"] {
		case "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "DEADLINE":
			t.Fatalf("job %s ended %s (exit %s, reason %s) while waiting for %s", id, job["JobState"], job["ExitCode"], job["Reason"], what)
		}
	}
	t.Fatalf("job %s: no %s within %v (state %s, reason %s)", id, what, timeout, job["JobState"], job["Reason"])
	return nil
}

func (c *Cluster) start(name string, args ...string) {
	c.t.Helper()
	d := &daemon{name: name, log: filepath.Join(c.Dir, "log", name+".out"), exited: make(chan struct{})}
	out, err := os.Create(d.log)
	if err != nil {
		c.t.Fatal(err)
	}
	defer out.Close()
	d.cmd = exec.Command(args[0], args[1:]...)
	d.cmd.Env = c.Env()
	d.cmd.Stdout, d.cmd.Stderr = out, out
	// Its own process group, and gone with the test binary.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		c.t.Skipf("SLURM cannot start: %s: %v", name, err)
	}
	go func() { d.cmd.Wait(); close(d.exited) }()
	c.daemons = append(c.daemons, d)
}

// waitFor waits up to 30 s for ready, and skips the test when a daemon
// exits first or ready never comes: SLURM cannot start here.
func (c *Cluster) waitFor(what string, ready func() bool) {
	c.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		for _, d := range c.daemons {
			select {
			case <-d.exited:
				c.t.Skipf("SLURM cannot start: %s exited (%v):\n%s", d.name, d.cmd.ProcessState, tail(d.log, 15))
			default:
			}
		}
		if ready() {
			return
		}
	}
	var logs []string
	for _, d := range c.daemons {
		logs = append(logs, d.name+":\n"+tail(d.log, 10))
	}
	c.t.Skipf("SLURM cannot start: no %s within 30s:\n%s", what, strings.Join(logs, "\n"))
}

// stop ends the daemons (SIGTERM, SIGKILL after 10 s), then kills what
// the cluster left running (slurmstepd, job processes), found by the
// marker in their environment.
func (c *Cluster) stop() {
	for i := len(c.daemons) - 1; i >= 0; i-- {
		d := c.daemons[i]
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(10 * time.Second):
			d.cmd.Process.Kill()
			<-d.exited
		}
	}
	for _, pid := range c.leftovers() {
		c.t.Logf("slurmtest: killing leftover process %d", pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if c.t.Failed() {
		for _, name := range []string{"slurmctld.log", "slurmd.log"} {
			c.t.Logf("%s:\n%s", name, tail(filepath.Join(c.Dir, "log", name), 20))
		}
	}
	os.RemoveAll(c.Dir)
}

// leftovers are the processes whose environment holds the cluster's
// marker.
func (c *Cluster) leftovers() []int {
	mark := []byte(markerEnv + "=" + c.Dir + "\x00")
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(append([]byte{0}, env...), append([]byte{0}, mark...)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// tail is the last n lines of a file.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
