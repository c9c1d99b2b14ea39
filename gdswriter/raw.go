package gdswriter

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
)

// RawWrite writes buf to a new file at path in blocks of blockSize bytes,
// with workers goroutines each writing whole blocks at their offsets, and
// fsyncs it: the plainest way to put bytes on a disk, and the baseline that
// stasis bench measures the Writer against. buf must be aligned (from an
// anonymous mapping) for O_DIRECT. It reports whether O_DIRECT was used.
func RawWrite(ctx context.Context, path string, buf []byte, blockSize, workers int, noDirect bool) (direct bool, err error) {
	f, err := openDirect(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, noDirect)
	if err != nil {
		return false, err
	}
	defer f.close()
	err = forBlocks(ctx, len(buf), blockSize, workers, func(off, end int) error {
		return f.writeAt(buf[off:end], int64(off))
	})
	if err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.sync(); err != nil {
		return false, fmt.Errorf("fsync %s: %w", path, err)
	}
	return f.Direct(), nil
}

// RawRead fills buf from the start of the file at path the same way.
func RawRead(ctx context.Context, path string, buf []byte, blockSize, workers int, noDirect bool) (direct bool, err error) {
	f, err := openDirect(path, os.O_RDONLY, noDirect)
	if err != nil {
		return false, err
	}
	defer f.close()
	err = forBlocks(ctx, len(buf), blockSize, workers, func(off, end int) error {
		return f.readAt(buf[off:end], int64(off))
	})
	if err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	return f.Direct(), nil
}

// forBlocks calls fn for each block [off, end) of a size-byte range from
// workers goroutines, stopping at the first error.
func forBlocks(ctx context.Context, size, blockSize, workers int, fn func(off, end int) error) error {
	if blockSize <= 0 {
		return fmt.Errorf("gdswriter: block size %d", blockSize)
	}
	var next atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for w := 0; w < max(workers, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				off := int(next.Add(int64(blockSize))) - blockSize
				if off >= size {
					return
				}
				err := ctx.Err()
				if err == nil {
					err = fn(off, min(off+blockSize, size))
				}
				if err != nil {
					once.Do(func() { first = err })
					next.Store(int64(size))
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}
