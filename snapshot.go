package stasis

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/stasis-ckpt/stasis/cuda"
	"golang.org/x/sys/unix"
)

// snapshotArena is the host memory (from mmap, outside Go's heap) that
// asynchronous saves copy buffers into. Once GPU memory has been copied
// into it, it is registered with the driver (pinned) in the background, so
// that the next snapshots run at the bus's speed: pinning gigabytes takes
// longer than copying them into unpinned memory once, so the first
// snapshot does not wait for it. It is kept, pinned, for later saves,
// grows to the largest state saved, and is freed by Store.Close.
type snapshotArena struct {
	buf     []byte
	drv     *cuda.Driver
	pinned  cuda.Context  // the context it was registered in; nil when not pinned
	pinning chan struct{} // closed when a background registration (or touch) ends; nil when none began
}

// pin registers the arena in ctx in the background.
func (a *snapshotArena) pin(ctx cuda.Context) {
	done := make(chan struct{})
	a.pinning = done
	go func() {
		defer close(done)
		if a.drv.RegisterHost(ctx, a.buf) == nil {
			a.pinned = ctx
		}
	}()
}

// touch faults every page of the arena in, in the background (for host
// buffers, which need no pinning: the first snapshot then does not pay
// for the faults).
func (a *snapshotArena) touch() {
	done := make(chan struct{})
	a.pinning = done
	go func() {
		defer close(done)
		if unix.Madvise(a.buf, unix.MADV_POPULATE_WRITE) == nil {
			return
		}
		for i := 0; i < len(a.buf); i += 4096 { // kernels before 5.14
			a.buf[i] = 0
		}
	}()
}

// waitPin waits for a background registration or touch to end.
func (a *snapshotArena) waitPin() {
	if a.pinning != nil {
		<-a.pinning
		a.pinning = nil
	}
}

const (
	snapshotAlign = 256      // each buffer's offset in the arena
	snapshotPiece = 64 << 20 // bytes per task of a host memory copy
	arenaGrain    = 2 << 20  // the arena's size is a multiple of this
)

// snapshot copies every buffer of ts into the arena and returns host views
// of the copies, named and shaped as the originals.
func (a *snapshotArena) snapshot(ts []Tensor) ([]Tensor, error) {
	a.waitPin()
	offsets, total := layout(ts)
	if err := a.reserve(total); err != nil {
		return nil, err
	}
	contexts, err := a.contexts(ts)
	if err != nil {
		return nil, err
	}
	views := make([]Tensor, len(ts))
	for i, t := range ts {
		v := t
		v.Device, v.Host = 0, a.buf[offsets[i]:offsets[i]+t.Bytes:offsets[i]+t.Bytes]
		views[i] = v
	}
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	setErr := func(err error) { errOnce.Do(func() { firstErr = err }) }
	// GPU memory: per context, every copy queued on one stream at once.
	byContext := map[cuda.Context][]int{}
	for i, t := range ts {
		if t.Device != 0 && t.Bytes > 0 {
			byContext[contexts[i]] = append(byContext[contexts[i]], i)
		}
	}
	for ctx, idx := range byContext {
		wg.Add(1)
		go func() {
			defer wg.Done()
			copies := make([]cuda.HostCopy, len(idx))
			for k, i := range idx {
				copies[k] = cuda.HostCopy{Dst: views[i].Host, Src: ts[i].Device}
			}
			if failed, err := a.drv.CopyManyToHost(ctx, copies); err != nil {
				if failed >= 0 {
					err = fmt.Errorf("%s: %w", ts[idx[failed]].Name, err)
				}
				setErr(err)
			}
		}()
	}
	// Host memory: copied in pieces by several workers.
	type piece struct{ tensor, off, n int64 }
	work := make(chan piece)
	for range max(runtime.GOMAXPROCS(0), 4) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range work {
				copy(views[p.tensor].Host[p.off:p.off+p.n], ts[p.tensor].Host[p.off:p.off+p.n])
			}
		}()
	}
	for i, t := range ts {
		if t.Device != 0 {
			continue
		}
		for off := int64(0); off < t.Bytes; off += snapshotPiece {
			work <- piece{int64(i), off, min(snapshotPiece, t.Bytes-off)}
		}
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if len(byContext) > 0 && a.pinned == nil {
		a.pin(contexts[indexOfDevice(ts)])
	}
	return views, nil
}

// prepare makes the arena ready for a snapshot of ts: allocated and, when
// ts holds GPU memory, pinned in the background.
func (a *snapshotArena) prepare(ts []Tensor) error {
	a.waitPin()
	_, total := layout(ts)
	if err := a.reserve(total); err != nil {
		return err
	}
	contexts, err := a.contexts(ts)
	if err != nil {
		return err
	}
	if i := indexOfDevice(ts); i >= 0 && a.pinned == nil {
		a.pin(contexts[i])
	} else if i < 0 && len(a.buf) > 0 {
		a.touch()
	}
	return nil
}

// layout places each buffer of ts in the arena.
func layout(ts []Tensor) (offsets []int64, total int64) {
	offsets = make([]int64, len(ts))
	for i, t := range ts {
		offsets[i] = total
		total += (t.Bytes + snapshotAlign - 1) / snapshotAlign * snapshotAlign
	}
	return offsets, total
}

// contexts returns the driver context of each GPU buffer of ts (nil for
// host buffers), loading the driver when there is one.
func (a *snapshotArena) contexts(ts []Tensor) ([]cuda.Context, error) {
	contexts := make([]cuda.Context, len(ts))
	for i, t := range ts {
		if t.Device == 0 {
			continue
		}
		if a.drv == nil {
			drv, err := cuda.LoadLibrary()
			if err != nil {
				return nil, err
			}
			a.drv = drv
		}
		ctx, err := a.drv.PointerContext(t.Device)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.Name, err)
		}
		contexts[i] = ctx
	}
	return contexts, nil
}

func indexOfDevice(ts []Tensor) int {
	for i, t := range ts {
		if t.Device != 0 {
			return i
		}
	}
	return -1
}

// reserve makes the arena at least n bytes long, replacing a smaller one.
func (a *snapshotArena) reserve(n int64) error {
	if n <= int64(len(a.buf)) {
		return nil
	}
	a.release()
	size := (n + arenaGrain - 1) / arenaGrain * arenaGrain
	buf, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("allocate %d bytes of snapshot memory: %w", size, err)
	}
	// Huge pages: the first snapshot touches every page, and a fault per
	// 4 KiB page costs more than the copy itself.
	unix.Madvise(buf, unix.MADV_HUGEPAGE)
	a.buf = buf
	return nil
}

// release unpins and frees the arena.
func (a *snapshotArena) release() {
	a.waitPin()
	if a.buf == nil {
		return
	}
	if a.pinned != nil {
		a.drv.UnregisterHost(a.pinned, a.buf)
		a.pinned = nil
	}
	unix.Munmap(a.buf)
	a.buf = nil
}
