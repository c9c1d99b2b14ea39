package hooks

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stasis-ckpt/stasis/hooks/hookstest"
)

func TestHookSeesTheCheckpointInItsEnvironment(t *testing.T) {
	out := t.TempDir()
	t.Setenv("HOOK_OUT", out)
	t.Setenv("STASIS_CHECKPOINT_ID", "inherited-from-the-caller")
	s := Scripts{PreCheckpoint: hookstest.Script(t, "hook_env.sh"), PostCheckpoint: hookstest.Script(t, "hook_env.sh")}
	ev := Event{Job: "llama", Step: 1200, PID: 4242, Kind: KindProcess, CheckpointID: "0b7c", Home: "/store"}
	for _, hook := range []string{PreCheckpoint, PostCheckpoint} {
		if err := s.Run(context.Background(), hook, ev, io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{"STASIS_JOB": "llama", "STASIS_STEP": "1200", "STASIS_PID": "4242", "STASIS_KIND": "process", "STASIS_HOME": "/store"}
	pre, post := hookstest.ReadEnv(t, filepath.Join(out, "pre_checkpoint.env")), hookstest.ReadEnv(t, filepath.Join(out, "post_checkpoint.env"))
	for k, v := range want {
		if pre[k] != v || post[k] != v {
			t.Errorf("%s: pre hook saw %q, post hook %q; want %q", k, pre[k], post[k], v)
		}
	}
	if pre["STASIS_HOOK"] != PreCheckpoint || post["STASIS_HOOK"] != PostCheckpoint {
		t.Errorf("STASIS_HOOK: %q and %q", pre["STASIS_HOOK"], post["STASIS_HOOK"])
	}
	if id, ok := pre["STASIS_CHECKPOINT_ID"]; ok {
		t.Errorf("the pre_checkpoint hook got STASIS_CHECKPOINT_ID=%q; there is no checkpoint yet", id)
	}
	if post["STASIS_CHECKPOINT_ID"] != "0b7c" {
		t.Errorf("post hook's STASIS_CHECKPOINT_ID is %q", post["STASIS_CHECKPOINT_ID"])
	}
}

func TestFailingHookNamesItselfItsStatusAndStderr(t *testing.T) {
	path := hookstest.Script(t, "hook_fail.sh")
	err := Scripts{PreCheckpoint: path}.Run(context.Background(), PreCheckpoint, Event{Job: "j"}, io.Discard)
	var he *HookError
	if !errors.As(err, &he) || !errors.Is(err, ErrHook) {
		t.Fatalf("got %v, want a *HookError", err)
	}
	want := "pre_checkpoint hook " + path + " exited with status 3: checking the job's data cannot quiesce the job: the data loader is busy"
	if err.Error() != want {
		t.Fatalf("error %q\nwant  %q", err, want)
	}
}

func TestMissingHookScriptFails(t *testing.T) {
	err := Scripts{PostRestore: "/nonexistent/hook"}.Run(context.Background(), PostRestore, Event{}, io.Discard)
	if !errors.Is(err, ErrHook) || !strings.Contains(err.Error(), "post_restore hook /nonexistent/hook could not run") {
		t.Fatalf("got %v", err)
	}
}

func TestHookPastItsTimeoutIsKilledWithWhatItStarted(t *testing.T) {
	out := t.TempDir()
	t.Setenv("HOOK_OUT", out)
	s := Scripts{PreCheckpoint: hookstest.Script(t, "hook_hang.sh"), Timeout: 300 * time.Millisecond}
	err := s.Run(context.Background(), PreCheckpoint, Event{}, io.Discard)
	if !errors.Is(err, ErrHook) || !strings.Contains(err.Error(), "timed out after 300ms") {
		t.Fatalf("got %v", err)
	}
	data, err := os.ReadFile(filepath.Join(out, "child.pid"))
	if err != nil {
		t.Fatal(err)
	}
	child, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := readProcStat(child)
		if err != nil || st.State == 'Z' {
			break
		}
		if time.Now().After(deadline) {
			syscall.Kill(child, syscall.SIGKILL)
			t.Fatalf("the hook's child %d outlived the hook's timeout", child)
		}
	}
}

// TestHookLeavingABackgroundChildSucceeds: a hook that exits 0 but leaves
// a child holding its output (an upload in the background) has succeeded;
// stasis says so in a warning.
func TestHookLeavingABackgroundChildSucceeds(t *testing.T) {
	out := t.TempDir()
	t.Setenv("HOOK_OUT", out)
	path := hookstest.Script(t, "hook_background.sh")
	var log strings.Builder
	if err := (Scripts{PostCheckpoint: path}).Run(context.Background(), PostCheckpoint, Event{Job: "j"}, &log); err != nil {
		t.Fatalf("got %v", err)
	}
	if want := "stasis: warning: post_checkpoint hook " + path + " exited 0 but left a process holding its output\n"; !strings.Contains(log.String(), want) {
		t.Errorf("log %q does not hold %q", log.String(), want)
	}
	data, err := os.ReadFile(filepath.Join(out, "child.pid"))
	if err != nil {
		t.Fatal(err)
	}
	if child, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
		syscall.Kill(child, syscall.SIGKILL)
	}
}
