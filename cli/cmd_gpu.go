package cli

import (
	"fmt"
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

// cudaCommand exposes the driver's checkpoint API step by step, as NVIDIA's
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
