// Package hooks connects stasis to schedulers, containers and users:
//
//   - Run (`stasis run`) starts a job as stasis's child, becomes its
//     subreaper, forwards the signals it does not own, and on a preemption
//     signal checkpoints the job: in app mode by telling it (a notice file
//     the job polls; it saves itself) and waiting for its checkpoint to be
//     listed, in process mode with CRIU (package checkpoint). On start it
//     resumes the job's latest checkpoint. Its Outcome says whether the
//     scheduler should requeue the job.
//   - PreStop (`stasis hook prestop`) asks a job's stasis run for that
//     checkpoint, or checkpoints a bare process, and waits for the commit:
//     what a Kubernetes preStop hook needs.
//   - Scripts are the user's hook scripts (pre_checkpoint,
//     post_checkpoint, post_restore), named in $STASIS_HOME/config.toml
//     (Config) or by flags; Checkpoint and Restore wrap the state machines
//     with them.
//
// A job's tree is its root's session (stasis starts the job with setsid):
// stasis run reaps the processes of the session orphaned to it, forwards
// signals to the root's process group, and stops the whole session. When
// stasis run is killed, the job's root gets SIGKILL (PR_SET_PDEATHSIG, which
// CRIU restores too) and a guard process (RunGuard) kills the rest of the
// session: no job runs on unsupervised. Processes that leave the session
// (setsid again) escape all of this.
//
// A process-mode job whose PIDs are taken when it resumes (a new
// container) is restored into a new PID namespace (restore.PIDNSAuto). Its
// root is then a child of that namespace's init, which stasis run started
// and waits for instead: the init exits with the root's status, and dies
// with stasis run (PR_SET_PDEATHSIG), taking the whole namespace along.
// Signals, the guard and checkpoints address the root by the PID stasis
// run sees; the checkpoint package dumps it from inside its namespace.
package hooks
