package hooks

import (
	"context"
	"fmt"
	"io"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/restore"
)

// Checkpoint is checkpoint.Run between the pre_checkpoint and
// post_checkpoint hooks. A failing pre_checkpoint hook stops it before
// anything is frozen: no checkpoint, and the job runs on. A failing
// post_checkpoint hook leaves the checkpoint stored; the error says so and
// the result is returned with it.
func Checkpoint(ctx context.Context, s *catalog.Store, o checkpoint.Options, scripts Scripts, log io.Writer) (*checkpoint.Result, error) {
	return checkpointWithCheck(ctx, s, o, scripts, log, nil)
}

// checkpointWithCheck is Checkpoint with a last check, made after the
// pre_checkpoint hook and right before the checkpoint: an error of it ends
// the checkpoint there, as is, with nothing frozen.
func checkpointWithCheck(ctx context.Context, s *catalog.Store, o checkpoint.Options, scripts Scripts, log io.Writer, check func() error) (*checkpoint.Result, error) {
	ev := Event{Job: o.Job, Step: o.Step, PID: o.PID, Kind: KindProcess, Home: s.Root}
	if scripts.PreCheckpoint != "" {
		if ev.Job == "" {
			tree, err := checkpoint.Tree(o.PID)
			if err != nil {
				return nil, err
			}
			ev.Job = tree[0].Comm
		}
		if err := scripts.Run(ctx, PreCheckpoint, ev, log); err != nil {
			return nil, fmt.Errorf("no checkpoint taken, the job runs on: %w", err)
		}
	}
	if check != nil {
		if err := check(); err != nil {
			return nil, err
		}
	}
	res, err := checkpoint.Run(ctx, s, o)
	if err != nil {
		return nil, err
	}
	ev.Job, ev.CheckpointID = res.Record.Job, res.Record.ID
	if err := scripts.Run(ctx, PostCheckpoint, ev, log); err != nil {
		return res, fmt.Errorf("checkpoint %s is stored, but: %w", res.Record.ID, err)
	}
	return res, nil
}

// Restore is restore.Run followed by the post_restore hook. A failing hook
// leaves the tree restored; the error says so and the result is returned
// with it.
func Restore(ctx context.Context, s *catalog.Store, id string, o restore.Options, scripts Scripts, log io.Writer) (*restore.Result, error) {
	res, err := restore.Run(ctx, s, id, o)
	if err != nil {
		return nil, err
	}
	ev := Event{Job: res.Manifest.Job, Step: res.Manifest.Step, PID: res.PID, Kind: KindProcess, CheckpointID: id, Home: s.Root}
	if err := scripts.Run(ctx, PostRestore, ev, log); err != nil {
		return res, fmt.Errorf("restored as PID %d, but: %w", res.PID, err)
	}
	return res, nil
}
