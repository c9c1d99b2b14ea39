package doctor

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"golang.org/x/sys/unix"
)

const minFreeBytes = 10 << 30

// checkStore reports the store directory, its free space and whether it
// takes O_DIRECT writes. A store that does not exist yet is judged by its
// nearest existing parent, where it will be created.
func checkStore(o Options) []Check {
	if o.StoreDir == "" {
		return []Check{{Name: "store", Status: Missing, Detail: "no store directory given", Hint: "set $STASIS_HOME"}}
	}
	dir, err := filepath.Abs(o.StoreDir)
	if err != nil {
		return []Check{{Name: "store", Status: Warn, Detail: err.Error(), Hint: "set $STASIS_HOME to an absolute path"}}
	}
	existing, err := nearestExisting(dir)
	if err != nil {
		return []Check{{Name: "store", Status: Warn, Detail: err.Error(), Hint: "check the permissions on the path to " + dir}}
	}

	var st unix.Stat_t
	if err := unix.Stat(existing, &st); err != nil {
		return []Check{{Name: "store", Status: Warn, Detail: fmt.Sprintf("cannot stat %s: %v", existing, err), Hint: "check the permissions on " + existing}}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return []Check{{Name: "store", Status: Missing, Detail: existing + " exists but is not a directory", Hint: "point $STASIS_HOME at a directory"}}
	}
	var fs unix.Statfs_t
	fsName := "unknown file system"
	if err := unix.Statfs(existing, &fs); err == nil {
		fsName = fileSystemName(uint32(fs.Type))
	}
	mode := os.FileMode(st.Mode & 0o777)
	attrs := fmt.Sprintf("mode %04o, owner %s, %s", uint32(mode), ownerName(st.Uid), fsName)
	if isMemoryBacked(uint32(fs.Type)) {
		attrs += " (in RAM: lost on reboot)"
	}

	store := Check{Name: "store", Status: OK}
	where := existing
	if existing == dir {
		store.Detail = dir + ": " + attrs
		if mode != 0o700 {
			store.Status = Warn
			store.Hint = "chmod 700 " + dir + " (checkpoints hold process memory, which may contain secrets)"
		}
	} else {
		where = existing + " (parent)"
		store.Detail = fmt.Sprintf("%s does not exist (will be created); nearest existing parent %s: %s", dir, existing, attrs)
		if err := unix.Access(existing, unix.W_OK|unix.X_OK); err != nil {
			store.Status = Warn
			store.Detail += "; parent not writable: " + err.Error()
			store.Hint = "create " + dir + " with mode 0700, or set $STASIS_HOME elsewhere"
		}
	}
	return []Check{store, freeSpaceCheck(existing, where), oDirectCheck(existing, where), ramScratchCheck()}
}

// ramScratchCheck reports where CRIU's images go while a checkpoint is
// taken (and a restore's, while it is unpacked), when they fit in RAM.
func ramScratchCheck() Check {
	dir, huge, mounted := catalog.RAMScratchPlan()
	c := Check{Name: "RAM scratch", Status: OK, Detail: dir}
	switch {
	case huge && mounted:
		c.Detail += ": tmpfs with huge pages"
	case huge:
		c.Detail += ": tmpfs with huge pages, mounted on first use"
	case dir == catalog.SharedRAMBase:
		c.Status = Warn
		c.Detail += ": 4 KiB pages (CRIU dumps about a third slower into it than into a tmpfs with huge pages)"
		c.Hint = "run stasis as root, which mounts " + catalog.HugeRAMBase + " with huge=always"
	default:
		c.Detail += " ($" + catalog.RAMScratchEnv + ")"
	}
	return c
}

// nearestExisting returns dir itself or the closest ancestor that exists.
func nearestExisting(dir string) (string, error) {
	for p := dir; ; p = filepath.Dir(p) {
		_, err := os.Stat(p)
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, os.ErrNotExist) || p == filepath.Dir(p) {
			return "", err
		}
	}
}

func ownerName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil {
		return u.Username
	}
	return "uid " + id
}

// File system magic numbers from statfs(2).
var fileSystemNames = map[uint32]string{
	unix.EXT4_SUPER_MAGIC:      "ext2/3/4",
	unix.XFS_SUPER_MAGIC:       "xfs",
	unix.BTRFS_SUPER_MAGIC:     "btrfs",
	unix.TMPFS_MAGIC:           "tmpfs",
	unix.RAMFS_MAGIC:           "ramfs",
	unix.OVERLAYFS_SUPER_MAGIC: "overlayfs",
	unix.NFS_SUPER_MAGIC:       "nfs",
	0x2fc12fc1:                 "zfs",
	unix.F2FS_SUPER_MAGIC:      "f2fs",
	unix.FUSE_SUPER_MAGIC:      "fuse",
	unix.CIFS_SUPER_MAGIC:      "cifs",
	unix.SMB2_SUPER_MAGIC:      "smb2",
	unix.CEPH_SUPER_MAGIC:      "ceph",
	0x0bd00bd0:                 "lustre",
	0x47504653:                 "gpfs",
}

func fileSystemName(magic uint32) string {
	if name, ok := fileSystemNames[magic]; ok {
		return name
	}
	return fmt.Sprintf("file system 0x%x", magic)
}

func isMemoryBacked(magic uint32) bool {
	return magic == unix.TMPFS_MAGIC || magic == unix.RAMFS_MAGIC
}

func freeSpaceCheck(dir, where string) Check {
	c := Check{Name: "store free space"}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		c.Status = Warn
		c.Detail = fmt.Sprintf("statfs %s: %v", dir, err)
		c.Hint = "check the store's file system is mounted and readable"
		return c
	}
	// Block counts are in units of the fragment size (equal to Bsize on
	// most file systems).
	unit := uint64(fs.Frsize)
	if unit == 0 {
		unit = uint64(fs.Bsize)
	}
	free, total := fs.Bavail*unit, fs.Blocks*unit
	c.Detail = fmt.Sprintf("%s free of %s on %s", formatGiB(free), formatGiB(total), where)
	c.Status = OK
	if free < minFreeBytes {
		c.Status = Warn
		c.Hint = "under " + formatGiB(minFreeBytes) + " free: a GPU job's checkpoint holds its host and device memory; free space or move $STASIS_HOME"
	}
	return c
}

func formatGiB(bytes uint64) string {
	return fmt.Sprintf("%.1f GiB", float64(bytes)/(1<<30))
}

// oDirectCheck creates a file with O_DIRECT, writes one page-aligned 4 KiB
// block to it and removes it again.
func oDirectCheck(dir, where string) Check {
	c := Check{Name: "store o_direct"}
	err := tryODirectWrite(dir)
	switch {
	case err == nil:
		c.Status = OK
		c.Detail = "O_DIRECT works on " + where
	case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP):
		c.Status = Warn
		c.Detail = fmt.Sprintf("no O_DIRECT (e.g. tmpfs): plain writes will be used on %s (%v)", where, err)
		c.Hint = "for direct I/O put $STASIS_HOME on a disk file system such as ext4 or xfs"
	default:
		c.Status = Warn
		c.Detail = fmt.Sprintf("could not test O_DIRECT on %s: %v", where, err)
		c.Hint = "make sure the store's file system is writable by this user"
	}
	return c
}

func tryODirectWrite(dir string) error {
	name := filepath.Join(dir, fmt.Sprintf(".stasis-doctor-odirect-%d-%d", os.Getpid(), time.Now().UnixNano()))
	fd, err := unix.Open(name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_DIRECT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		// Some file systems (ramfs) create the file before refusing O_DIRECT.
		if !errors.Is(err, unix.EEXIST) {
			unix.Unlink(name)
		}
		return fmt.Errorf("open: %w", err)
	}
	defer unix.Unlink(name)
	defer unix.Close(fd)

	// An anonymous mapping is page-aligned, which satisfies any logical
	// block size O_DIRECT may demand.
	const blockSize = 4096
	block, err := unix.Mmap(-1, 0, blockSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("mmap: %w", err)
	}
	defer unix.Munmap(block)
	for i := range block {
		block[i] = byte(i)
	}
	n, err := unix.Write(fd, block)
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if n != blockSize {
		return fmt.Errorf("write: %d of %d bytes", n, blockSize)
	}
	return nil
}
