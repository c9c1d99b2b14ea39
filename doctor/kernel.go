package doctor

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

func checkKernel(o Options) Check {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return Check{Name: "kernel", Status: Warn, Detail: "uname failed: " + err.Error(), Hint: "stasis needs a Linux kernel"}
	}
	release := unix.ByteSliceToString(uts.Release[:])
	machine := unix.ByteSliceToString(uts.Machine[:])
	return Check{
		Name:   "kernel",
		Status: OK,
		Detail: fmt.Sprintf("%s %s; soft-dirty: %s", release, machine, softDirty(o, release)),
	}
}

// softDirty says whether the kernel tracks soft-dirty pages (needed for
// incremental memory dumps), and how that was learned.
func softDirty(o Options, release string) string {
	for _, path := range kernelConfigPaths(o, release) {
		value, err := kernelConfigValue(path, "CONFIG_MEM_SOFT_DIRTY")
		if err != nil {
			continue
		}
		if value == "y" {
			return "yes (CONFIG_MEM_SOFT_DIRTY=y in " + path + ")"
		}
		return "no (CONFIG_MEM_SOFT_DIRTY not set in " + path + ")"
	}
	if o.realProc() && pagemapShowsSoftDirty() {
		return "yes (a freshly written page is marked soft-dirty in /proc/self/pagemap)"
	}
	if _, err := os.Stat(filepath.Join(o.procRoot(), "self", "clear_refs")); err == nil {
		return "unknown (kernel config not readable; /proc/self/clear_refs exists)"
	}
	return "unknown (kernel config not readable)"
}

func kernelConfigPaths(o Options, release string) []string {
	paths := []string{filepath.Join(o.procRoot(), "config.gz")}
	if o.realProc() {
		paths = append(paths, "/boot/config-"+release)
	}
	return paths
}

// kernelConfigValue returns the value of option in a kernel config file
// (gzip-compressed when the name ends in .gz), or "" when it is not set.
func kernelConfigValue(path, option string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return "", err
		}
		defer gz.Close()
		r = gz
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if value, ok := strings.CutPrefix(sc.Text(), option+"="); ok {
			return value, nil
		}
	}
	return "", sc.Err()
}

// pagemapShowsSoftDirty writes to a fresh anonymous page and reads its
// /proc/self/pagemap entry: bit 55 is set only when soft-dirty tracking is
// compiled in. A clear bit proves nothing, so only a set bit is trusted.
func pagemapShowsSoftDirty() bool {
	pageSize := os.Getpagesize()
	page, err := unix.Mmap(-1, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return false
	}
	defer unix.Munmap(page)
	page[0] = 1

	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return false
	}
	defer f.Close()
	var entry [8]byte
	offset := int64(uintptr(unsafe.Pointer(&page[0]))/uintptr(pageSize)) * 8
	if _, err := f.ReadAt(entry[:], offset); err != nil {
		return false
	}
	return binary.NativeEndian.Uint64(entry[:])&(1<<55) != 0
}
