package criu

// #include "nsenter.h"
import "C"

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// nsenterEnv, in the environment of the criu launcher, names the process
// whose PID and mount namespaces CRIU must run in, and those namespaces:
// "PID:PIDNS:MNTNS" (the namespaces' inode numbers). nsenter.c enters
// them before the Go runtime starts; Launch checks that it did.
const nsenterEnv = C.NSENTER_ENV

// namespaces is the "PID:PIDNS:MNTNS" of pid.
func namespaces(pid int) (string, error) {
	ids := []string{strconv.Itoa(pid)}
	for _, ns := range []string{"pid", "mnt"} {
		ino, err := nsInode(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err != nil {
			return "", fmt.Errorf("the namespaces of PID %d: %w", pid, err)
		}
		ids = append(ids, strconv.FormatUint(ino, 10))
	}
	return strings.Join(ids, ":"), nil
}

func nsInode(path string) (uint64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return st.Sys().(*syscall.Stat_t).Ino, nil
}

// entered checks that this process runs in the namespaces spec names.
func entered(spec string) error {
	f := strings.Split(spec, ":")
	if len(f) != 3 {
		return fmt.Errorf("%s=%q: want PID:PIDNS:MNTNS", nsenterEnv, spec)
	}
	for i, ns := range []string{"pid", "mnt"} {
		ino, err := nsInode("/proc/self/ns/" + ns)
		if err != nil || strconv.FormatUint(ino, 10) != f[i+1] {
			return fmt.Errorf("not inside the %s namespace of PID %s, which CRIU must run in (%s:[%s], is %d: %v)", ns, f[0], ns, f[i+1], ino, err)
		}
	}
	return nil
}
