// The criu launcher's way into a job's namespaces. setns(2) into a mount
// namespace needs a single-threaded process, and the Go runtime starts
// threads before main: so this runs as an ELF constructor, before it.
// See nsenter.go.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nsenter.h"

static void nsenter_fail(const char *what)
{
	fprintf(stderr, "stasis: criu launcher: %s: %s\n", what, strerror(errno));
	_exit(1);
}

static int open_ns(long pid, const char *ns)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%ld/ns/%s", pid, ns);
	return open(path, O_RDONLY | O_CLOEXEC);
}

// With STASIS_CRIU_NSENTER=PID:... and "swrk" as the first argument (the
// launcher go-criu starts), enter PID's PID and mount namespaces, fork, and
// let the child go on (into Go's main, which execs criu) while this
// process waits for it and exits as it did. A PID namespace holds only
// children forked after setns, hence the fork.
__attribute__((constructor)) static void stasis_nsenter(int argc, char **argv)
{
	const char *spec = getenv(NSENTER_ENV);
	if (spec == NULL || *spec == '\0' || argc < 2 || strcmp(argv[1], "swrk") != 0)
		return;
	long pid = strtol(spec, NULL, 10);
	if (pid <= 0) {
		errno = EINVAL;
		nsenter_fail(NSENTER_ENV);
	}
	int pidns = open_ns(pid, "pid"), mntns = open_ns(pid, "mnt");
	if (pidns < 0 || mntns < 0)
		nsenter_fail("open the job's namespaces");
	if (setns(pidns, CLONE_NEWPID) < 0)
		nsenter_fail("enter the job's PID namespace");
	if (setns(mntns, CLONE_NEWNS) < 0)
		nsenter_fail("enter the job's mount namespace");
	close(pidns);
	close(mntns);
	// Out of stasis's process group, as the launcher itself goes: a
	// Ctrl-C to stasis must not end this process under go-criu.
	setpgid(0, 0);
	pid_t child = fork();
	if (child < 0)
		nsenter_fail("fork");
	if (child == 0)
		return;
	int status;
	while (waitpid(child, &status, 0) < 0)
		if (errno != EINTR)
			nsenter_fail("wait");
	_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}
