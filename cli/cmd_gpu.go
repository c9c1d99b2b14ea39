package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/cuda"
	ucli "github.com/urfave/cli/v2"
)

func (e *env) recoverCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "recover",
		Usage: "restore and unlock CUDA processes left locked or checkpointed (for instance by a killed stasis)",
		Flags: []ucli.Flag{
			&ucli.IntSliceFlag{Name: "pid", Usage: "only these processes (default: every process using CUDA)"},
			&ucli.DurationFlag{Name: "wait", Value: 30 * time.Second, Usage: "how long to wait for a CRIU dump still running on a process"},
			&ucli.BoolFlag{Name: "json", Usage: "print what was done as JSON"},
		},
		Action: func(c *ucli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			drv, err := cuda.Load()
			if err != nil {
				return err
			}
			done := checkpoint.Recover(drv, c.IntSlice("pid"), c.Duration("wait"))
			if c.Bool("json") {
				if done == nil {
					done = []checkpoint.Recovered{}
				}
				return printJSON(e.stdout, done)
			}
			failed := 0
			for _, r := range done {
				fmt.Fprintf(e.stdout, "PID %d: %s: %s\n", r.PID, r.Before, r.Action)
				if !r.OK {
					failed++
				}
			}
			if len(done) == 0 {
				fmt.Fprintln(e.stdout, "no CUDA processes found")
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d processes could not be recovered", failed, len(done))
			}
			return nil
		},
	}
}

func (e *env) migrateCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "migrate",
		Usage: "move a running GPU job onto other GPUs of this machine, in place (CUDA checkpoint and restore; no CRIU, no files)",
		Flags: []ucli.Flag{
			&ucli.IntFlag{Name: "pid", Required: true, Usage: "the job (the root of its process tree)"},
			&ucli.StringFlag{Name: "gpu-map", Usage: "OLD=NEW,... (GPU indexes or UUIDs): which GPU takes over which; completed one-to-one (0=1 on two GPUs swaps them)"},
			&ucli.StringFlag{Name: "to-gpu", Usage: "the GPU (index or UUID) that takes over the one GPU the job uses"},
			&ucli.DurationFlag{Name: "gpu-lock-timeout", Value: checkpoint.DefaultLockTimeout, Usage: "how long the CUDA lock waits for GPU work already submitted; past it the migration is rolled back"},
			&ucli.BoolFlag{Name: "json", Usage: "print the moves and timings as JSON"},
		},
		Action: func(c *ucli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			if (c.String("gpu-map") == "") == (c.String("to-gpu") == "") {
				return usagef("give either --gpu-map OLD=NEW,... or --to-gpu N")
			}
			gpuMap, err := cuda.ParseGPUMap(c.String("gpu-map"))
			if err != nil {
				return usagef(err.Error())
			}
			var to string
			if c.String("to-gpu") != "" {
				if to, err = cuda.ParseGPUName(c.String("to-gpu")); err != nil {
					return usagef("--to-gpu: " + err.Error())
				}
			}
			s, err := openStore(c)
			if err != nil {
				return err
			}
			res, err := checkpoint.Migrate(checkpoint.MigrateOptions{
				PID: c.Int("pid"), GPUMap: gpuMap, ToGPU: to, LockTimeout: c.Duration("gpu-lock-timeout"), LogPath: s.LogPath("watchdog.log"),
			})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(e.stdout, map[string]any{
					"pid": c.Int("pid"), "cuda_pids": res.PIDs, "moves": res.Moves, "lock_seconds": res.Lock.Seconds(),
					"checkpoint_seconds": res.Checkpoint.Seconds(), "restore_seconds": res.Restore.Seconds(),
					"unlock_seconds": res.Unlock.Seconds(), "total_seconds": res.Total.Seconds(),
				})
			}
			if len(res.Moves) == 0 {
				fmt.Fprintf(e.stdout, "PID %d already runs where the map sends it; nothing to do\n", c.Int("pid"))
				return nil
			}
			moves := make([]string, len(res.Moves))
			for i, m := range res.Moves {
				moves[i] = fmt.Sprintf("GPU %d -> GPU %d", m.From.Index, m.To.Index)
			}
			ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
			fmt.Fprintf(e.stdout, "migrated PID %d (%s): lock %s, checkpoint %s, restore %s, unlock %s, total %s\n", c.Int("pid"),
				strings.Join(moves, ", "), ms(res.Lock), ms(res.Checkpoint), ms(res.Restore), ms(res.Unlock), ms(res.Total))
			return nil
		},
	}
}

// cudaCommand exposes the driver's checkpoint steps one by one (through
// the backend stasis uses: libcuda's API or cuda-checkpoint), as NVIDIA's
// cuda-checkpoint tool does: for operators, and for measuring the by-hand
// sequence stasis is compared with.
func (e *env) cudaCommand() *ucli.Command {
	pidFlag := &ucli.IntFlag{Name: "pid", Required: true, Usage: "the CUDA process"}
	step := func(name, usage string, do func(*cuda.Driver, *ucli.Context) error) *ucli.Command {
		return &ucli.Command{
			Name:  name,
			Usage: usage,
			Flags: []ucli.Flag{pidFlag, &ucli.DurationFlag{Name: "timeout", Value: checkpoint.DefaultLockTimeout, Usage: "lock only: how long to wait for submitted GPU work"}},
			Action: func(c *ucli.Context) error {
				if err := noArgs(c); err != nil {
					return err
				}
				drv, err := cuda.Load()
				if err != nil {
					return err
				}
				start := time.Now()
				if err := do(drv, c); err != nil {
					return err
				}
				st, err := drv.ProcessState(c.Int("pid"))
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "%s (%s)\n", st, time.Since(start).Round(time.Millisecond))
				return nil
			},
		}
	}
	return &ucli.Command{
		Name:  "cuda",
		Usage: "the CUDA checkpoint API by hand: state, lock, checkpoint, restore, unlock",
		Subcommands: []*ucli.Command{
			step("state", "print the process's checkpoint state", func(*cuda.Driver, *ucli.Context) error { return nil }),
			step("lock", "block the process's CUDA calls and wait for its GPU work", func(d *cuda.Driver, c *ucli.Context) error {
				return d.Lock(c.Int("pid"), c.Duration("timeout"))
			}),
			step("checkpoint", "move a locked process's GPU memory into its host memory", func(d *cuda.Driver, c *ucli.Context) error {
				return d.Checkpoint(c.Int("pid"))
			}),
			step("restore", "bring a checkpointed process's GPU memory back (it stays locked)", func(d *cuda.Driver, c *ucli.Context) error {
				return d.Restore(c.Int("pid"), nil)
			}),
			step("unlock", "let a locked process call CUDA again", func(d *cuda.Driver, c *ucli.Context) error {
				return d.Unlock(c.Int("pid"))
			}),
		},
	}
}
