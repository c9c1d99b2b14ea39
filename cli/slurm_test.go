package cli_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/internal/slurmtest"
)

// TestSLURMPreemptRequeueResume runs scripts/slurm-example.sbatch under a
// real one-node SLURM (internal/slurmtest): a job of 4 ranks (srun), each
// under `stasis run` in app mode running testdata/slurm_train.py. Once every
// rank holds mid-run, SIGUSR1 is sent the two ways SLURM sends it:
//
//   - steps: `scancel --signal=USR1`, which signals every task of the job's
//     steps and not the batch shell, as `#SBATCH --signal=USR1@N` does;
//   - batch: `scancel --batch --signal=USR1`, which signals the batch shell
//     only, as `#SBATCH --signal=B:USR1@N` does: the script passes it on to
//     srun, which sends it to every task;
//   - full: `scancel --full --signal=USR1`, both: every stasis run gets it
//     twice.
//
// Every rank must save its state and its stasis run exit 75, the script
// requeue the job, and the job, started again, resume every rank from the
// step it checkpointed with the state that step determines, and run to the
// end.
func TestSLURMPreemptRequeueResume(t *testing.T) {
	py := pythonWithNumPy(t)
	check := exec.Command(py, "-c", "import stasis; stasis.library_path()")
	check.Env = append(os.Environ(), pythonPath(t))
	if out, err := check.CombinedOutput(); err != nil {
		t.Skipf("the stasis Python package cannot load its library: %s", lastLine(string(out)))
	}
	c := slurmtest.Start(t)
	for _, how := range []struct {
		name     string
		signal   []string // scancel's flags
		forwards bool     // the batch shell gets SIGUSR1 and passes it on
	}{
		{"steps", []string{"--signal=USR1"}, false},
		{"batch", []string{"--batch", "--signal=USR1"}, true},
		{"full", []string{"--full", "--signal=USR1"}, true},
	} {
		t.Run(how.name, func(t *testing.T) {
			slurmPreemptRequeueResume(t, c, py, "train-"+how.name, how.signal, how.forwards)
		})
	}
}

const (
	slurmRanks = 4
	slurmSteps = 60 // each rank's whole training
	slurmHold  = 30 // rank r holds at step slurmHold + r until preempted
)

// slurmRankJob is the stasis job of a rank: one per rank, as the example
// script names them. Job-level checkpoints (one across the ranks) would
// make it the SLURM job's name for every rank.
func slurmRankJob(job string, rank int) string { return fmt.Sprintf("%s-rank%d", job, rank) }

func slurmPreemptRequeueResume(t *testing.T, c *slurmtest.Cluster, py, job string, signal []string, forwards bool) {
	home, work := t.TempDir(), t.TempDir()
	script, err := filepath.Abs("../scripts/slurm-example.sbatch")
	if err != nil {
		t.Fatal(err)
	}
	train, _ := filepath.Abs("testdata/slurm_train.py")
	lib, _ := filepath.Abs("../bin/libstasis.so")
	out := filepath.Join(work, job+".out")
	// The script as a user submits it; on the command line what this
	// machine needs: 4 tasks on its cores (--overcommit), the paths.
	sbatch := c.Command("sbatch", "--parsable", "--overcommit", "--job-name="+job, "--output="+out, "--chdir="+work,
		script, py, train, strconv.Itoa(slurmSteps), strconv.Itoa(slurmHold))
	sbatch.Env = append(sbatch.Env, "STASIS_HOME="+home, "STASIS="+stasisBin, "STASIS_GRACE=60s", pythonPath(t), "STASIS_LIB="+lib)
	sbatchOut, err := sbatch.CombinedOutput()
	if err != nil {
		t.Fatalf("sbatch: %v: %s", err, sbatchOut)
	}
	id := strings.TrimSpace(string(sbatchOut))
	t.Cleanup(func() {
		if t.Failed() {
			data, _ := os.ReadFile(out)
			t.Logf("job %s's output:\n%s", id, data)
		}
		c.Command("scancel", id).Run()
	})

	// Every rank holding mid-run: preempt.
	for rank := 0; rank < slurmRanks; rank++ {
		waitOutput(t, c, id, out, fmt.Sprintf("rank %d: holding at step %d\n", rank, slurmHold+rank))
	}
	c.Run(t, "scancel", append(signal, id)...)

	// The script requeues the job: SLURM makes it eligible again after a
	// delay of its own (BeginTime, 2 minutes in 22.05), which the test
	// cuts short.
	requeued := c.WaitJob(t, id, time.Minute, "requeue", func(j map[string]string) bool {
		return j["Restarts"] == "1" && (j["JobState"] == "PENDING" || j["JobState"] == "RUNNING" || j["JobState"] == "COMPLETED")
	})
	if requeued["JobState"] == "PENDING" {
		c.Run(t, "scontrol", "update", "JobId="+id, "StartTime=now")
	}
	c.WaitJob(t, id, 90*time.Second, "completion", func(j map[string]string) bool { return j["JobState"] == "COMPLETED" })

	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	log := string(data)
	for _, want := range []string{
		fmt.Sprintf("batch: job %s, start 0\n", id),
		fmt.Sprintf("batch: every rank committed its checkpoint; requeueing job %s\n", id),
		fmt.Sprintf("batch: job %s, start 1\n", id),
		"batch: done\n",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the job's output lacks %q", want)
		}
	}
	if forwarded := strings.Contains(log, "batch: SIGUSR1, passed on to the ranks"); forwarded != forwards {
		t.Errorf("the batch shell passed SIGUSR1 on: %v, with scancel %v", forwarded, signal)
	}
	for rank := 0; rank < slurmRanks; rank++ {
		step := slurmHold + rank
		rj := slurmRankJob(job, rank)
		recs := list(t, home, "--job", rj)
		if len(recs) != 1 || recs[0].Step != int64(step) {
			t.Errorf("rank %d: checkpoints of job %s: %+v, want one of step %d", rank, rj, recs, step)
			continue
		}
		for _, want := range []string{
			fmt.Sprintf("rank %d: preempted; saved step %d\n", rank, step),
			fmt.Sprintf("stasis run: job %q preempted and checkpointed as %s: exit 75 (requeue it)\n", rj, recs[0].ID),
			fmt.Sprintf("stasis run: job %q resumes from checkpoint %s (step %d)\n", rj, recs[0].ID, step),
			fmt.Sprintf("rank %d: resumed at step %d; state matches\n", rank, step),
			fmt.Sprintf("rank %d: done at step %d; state matches\n", rank, slurmSteps),
		} {
			if strings.Count(log, want) != 1 {
				t.Errorf("rank %d: the job's output has %q %d times, want once", rank, want, strings.Count(log, want))
			}
		}
	}
}

// waitOutput waits until the job's output holds line; it fails the test
// when the job ends first.
func waitOutput(t *testing.T, c *slurmtest.Cluster, id, out, line string) {
	t.Helper()
	c.WaitJob(t, id, time.Minute, fmt.Sprintf("%q in its output", strings.TrimSpace(line)), func(j map[string]string) bool {
		data, _ := os.ReadFile(out)
		if strings.Contains(string(data), line) {
			return true
		}
		if j["JobState"] == "COMPLETED" {
			t.Fatalf("job %s completed without %q in its output", id, strings.TrimSpace(line))
		}
		return false
	})
}
