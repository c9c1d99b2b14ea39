package cuda

import (
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRealGPUCRC32C runs the checksum kernel on a real GPU and compares
// its results with hash/crc32's on the host, for ranges of odd lengths
// and alignments and from several goroutines at once. It logs how long a
// 4 MiB chunk takes (a figure, not asserted).
//
//	STASIS_GPU_TEST=1 go test ./cuda -run RealGPU -v
//
// $STASIS_CRC32C_PTX tries a PTX regenerated from kernels/crc32c.cu.
func TestRealGPUCRC32C(t *testing.T) {
	if os.Getenv("STASIS_GPU_TEST") == "" {
		t.Skip("needs an NVIDIA GPU: set STASIS_GPU_TEST=1 on the GPU machine")
	}
	d, err := LoadLibrary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := d.PrimaryContext(0)
	if err != nil {
		t.Fatal(err)
	}
	const n = 9<<20 + 4099
	host, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(host)
	r := rand.New(rand.NewPCG(7, 8))
	for i := range host {
		host[i] = byte(r.Uint32())
	}
	dev, err := d.Alloc(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(ctx, dev)
	if err := d.CopyToDevice(ctx, dev, host); err != nil {
		t.Fatal(err)
	}
	k, err := d.NewCRC32C(ctx, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	type span struct{ off, n int }
	var spans []span
	for _, off := range []int{0, 1, 3, 4, 8, 4095, 4096} {
		for _, l := range []int{1, 7, 8, 9, 4095, 4096, 4097, 3*4096 + 5, 4 << 20, 4<<20 - 1, 9 << 20} {
			spans = append(spans, span{off, l})
		}
	}
	var wg sync.WaitGroup
	errs := make(chan string, len(spans))
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < len(spans); i += 8 {
				s := spans[i]
				got, err := k.Checksum(dev+uintptr(s.off), int64(s.n))
				want := crc32.Checksum(host[s.off:s.off+s.n], castagnoli)
				if err != nil || got != want {
					errs <- fmt.Sprintf("+%d, %d bytes: got %08x, want %08x (%v)", s.off, s.n, got, want, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	start := time.Now()
	const rounds = 64
	for i := 0; i < rounds; i++ {
		if _, err := k.Checksum(dev, 4<<20); err != nil {
			t.Fatal(err)
		}
	}
	per := time.Since(start) / rounds
	t.Logf("%d ranges checked; a 4 MiB chunk takes %v on the GPU, launch and copy back included (%.1f GB/s, one at a time)",
		len(spans), per, float64(4<<20)/per.Seconds()/1e9)
}
