// Package bench measures stasis's save and load against raw O_DIRECT I/O of
// the same bytes on the same disk, in one run, so that the ratio between the
// two means something on a noisy machine.
package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"golang.org/x/sys/unix"
)

// Options configure Run.
type Options struct {
	Dir     string // where to write (a scratch directory is made and removed there)
	Size    int64  // bytes, a multiple of 4096
	Method  gdswriter.Method
	Data    string        // "bf16" or "random"
	Rounds  int           // raw and stasis alternate this many times; the best of each counts
	Workers int           // goroutines for both sides; gdswriter.DefaultWorkers() when zero
	Settle  time.Duration // pause after a sync before each timed step
	Log     func(string)
}

// Result is what `stasis bench --json` prints.
type Result struct {
	Bytes        int64   `json:"bytes"`
	Data         string  `json:"data"`
	Compress     string  `json:"compress"`
	Workers      int     `json:"workers"`
	Rounds       int     `json:"rounds"`
	Direct       bool    `json:"direct"`
	RawWriteGBps float64 `json:"raw_write_gbps"`
	RawReadGBps  float64 `json:"raw_read_gbps"`
	SaveGBps     float64 `json:"save_gbps"`
	LoadGBps     float64 `json:"load_gbps"`
	SaveRatio    float64 `json:"save_ratio"` // save_gbps / raw_write_gbps
	LoadRatio    float64 `json:"load_ratio"` // load_gbps / raw_read_gbps
	StoredBytes  int64   `json:"stored_bytes"`
	StoredRatio  float64 `json:"stored_ratio"` // stored_bytes / bytes
}

// ParseSize reads sizes such as 4096, 512MiB, 2GiB, 1.5GB.
func ParseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}}
	num, mult := strings.TrimSpace(s), 1.0
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || v*mult > 1<<50 {
		return 0, fmt.Errorf("%q is not a size such as 512MiB or 2GiB", s)
	}
	return int64(v * mult), nil
}

// Run measures, in this order and alternating each round: raw write, raw
// read, stasis save (chunking, compression, checksums, fsync, manifest,
// catalog commit) and stasis load (reads, checks, decodes into memory). The
// loaded bytes are compared with the originals.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Size <= 0 || o.Size%gdswriter.Alignment != 0 {
		return nil, fmt.Errorf("%w: size %d must be a positive multiple of %d", catalog.ErrInvalid, o.Size, gdswriter.Alignment)
	}
	if o.Rounds <= 0 {
		o.Rounds = 1
	}
	if o.Workers <= 0 {
		o.Workers = gdswriter.DefaultWorkers()
	}
	if o.Data == "" {
		o.Data = "bf16"
	}
	log := o.Log
	if log == nil {
		log = func(string) {}
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, err
	}
	scratch, err := os.MkdirTemp(o.Dir, ".stasis-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)

	src, err := mapAnon(o.Size)
	if err != nil {
		return nil, err
	}
	defer unix.Munmap(src)
	dst, err := mapAnon(o.Size)
	if err != nil {
		return nil, err
	}
	defer unix.Munmap(dst)
	log(fmt.Sprintf("generating %d bytes of %s data", o.Size, o.Data))
	if err := fill(src, o.Data, o.Workers); err != nil {
		return nil, err
	}

	res := &Result{Bytes: o.Size, Data: o.Data, Compress: string(o.Method), Workers: o.Workers, Rounds: o.Rounds}
	store, err := catalog.Open(filepath.Join(scratch, "store"), catalog.Options{})
	if err != nil {
		return nil, err
	}
	gbps := func(d time.Duration) float64 { return float64(o.Size) / d.Seconds() / 1e9 }
	// settle lets the disk finish what the previous step left (write-back,
	// discards of deleted files) so that each timed step starts alike.
	settle := func() {
		unix.Sync()
		time.Sleep(o.Settle)
	}
	for round := 0; round < o.Rounds; round++ {
		steps := []func() error{
			func() error {
				path := filepath.Join(scratch, "raw")
				settle()
				start := time.Now()
				direct, err := gdswriter.RawWrite(ctx, path, src, gdswriter.DefaultChunkSize, o.Workers, false)
				if err != nil {
					return err
				}
				w := gbps(time.Since(start))
				clear(dst)
				settle()
				start = time.Now()
				if _, err := gdswriter.RawRead(ctx, path, dst, gdswriter.DefaultChunkSize, o.Workers, false); err != nil {
					return err
				}
				r := gbps(time.Since(start))
				res.Direct = direct
				res.RawWriteGBps, res.RawReadGBps = max(res.RawWriteGBps, w), max(res.RawReadGBps, r)
				log(fmt.Sprintf("round %d: raw write %.2f GB/s, read %.2f GB/s", round+1, w, r))
				return os.Remove(path)
			},
			func() error {
				settle()
				start := time.Now()
				rec, err := save(ctx, store, src, o)
				if err != nil {
					return err
				}
				w := gbps(time.Since(start))
				clear(dst)
				settle()
				start = time.Now()
				if err := load(ctx, store, rec.ID, dst, o.Workers); err != nil {
					return err
				}
				r := gbps(time.Since(start))
				if !bytes.Equal(src, dst) {
					return errors.New("bench: loaded bytes differ from the saved ones")
				}
				res.SaveGBps, res.LoadGBps = max(res.SaveGBps, w), max(res.LoadGBps, r)
				res.StoredBytes = rec.StoredBytes
				log(fmt.Sprintf("round %d: stasis save %.2f GB/s, load %.2f GB/s, stored %.3f", round+1, w, r, float64(rec.StoredBytes)/float64(o.Size)))
				return store.Remove(rec.ID)
			},
		}
		if round%2 == 1 {
			steps[0], steps[1] = steps[1], steps[0]
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return nil, err
			}
		}
	}
	res.SaveRatio = res.SaveGBps / res.RawWriteGBps
	res.LoadRatio = res.LoadGBps / res.RawReadGBps
	res.StoredRatio = float64(res.StoredBytes) / float64(o.Size)
	return res, nil
}

func save(ctx context.Context, s *catalog.Store, src []byte, o Options) (*catalog.Record, error) {
	p, err := s.Begin(catalog.KindFiles, "bench", 0, nil)
	if err != nil {
		return nil, err
	}
	rec, err := func() (*catalog.Record, error) {
		w, err := gdswriter.Create(ctx, p.Path("data.0000"), gdswriter.WriterOptions{Method: o.Method, Workers: o.Workers})
		if err != nil {
			return nil, err
		}
		if err := w.WriteShared(src); err != nil {
			w.Abort()
			return nil, err
		}
		r, err := w.Close()
		if err != nil {
			return nil, err
		}
		p.Manifest.Files = []catalog.DataFile{catalog.NewDataFile("data.0000", r)}
		p.Manifest.Entries = []catalog.Entry{{Path: "bench.bin", Type: catalog.EntryFile, Size: r.RawSize, Mode: 0o600}}
		return p.Commit()
	}()
	if err != nil {
		p.Abort()
	}
	return rec, err
}

func load(ctx context.Context, s *catalog.Store, id string, dst []byte, workers int) error {
	m, err := s.ReadManifest(id)
	if err != nil {
		return err
	}
	return s.ReadFileInto(ctx, m, m.Files[0], dst, catalog.ReadOptions{Workers: workers})
}

func mapAnon(size int64) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("allocate %d bytes: %w", size, err)
	}
	return b, nil
}

// fill writes test data into buf: "random" bytes, or "bf16" values drawn
// from normal(0, 0.02) as model weights are. A 64 MiB block is generated
// and repeated: repeats lie further apart than a chunk, so no codec can
// profit from them.
func fill(buf []byte, kind string, workers int) error {
	const block = 64 << 20
	if kind != "random" && kind != "bf16" {
		return fmt.Errorf("%w: --data %q: use bf16 or random", catalog.ErrInvalid, kind)
	}
	n := min(len(buf), block)
	pattern := buf[:n]
	per := (n/workers + 1) &^ 1
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		lo, hi := min(w*per, n), min((w+1)*per, n)
		wg.Add(1)
		go func(part []byte, seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 0x5741515))
			switch kind {
			case "random":
				for i := 0; i+8 <= len(part); i += 8 {
					v := rng.Uint64()
					for j := 0; j < 8; j++ {
						part[i+j] = byte(v >> (8 * j))
					}
				}
			default:
				for i := 0; i+2 <= len(part); i += 2 {
					bits := math.Float32bits(float32(rng.NormFloat64() * 0.02))
					bits += 0x7fff + (bits>>16)&1 // round to nearest even
					part[i], part[i+1] = byte(bits>>16), byte(bits>>24)
				}
			}
		}(pattern[lo:hi], uint64(w)+1)
	}
	wg.Wait()
	for off := n; off < len(buf); off += n {
		copy(buf[off:], pattern)
	}
	return nil
}
