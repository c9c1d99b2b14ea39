package cuda

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestCombineCRC32C joins the checksums of two random pieces of random
// lengths (zero, one byte, a block, odd sizes) and compares with
// hash/crc32's checksum of the whole.
func TestCombineCRC32C(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	lengths := []int{0, 1, 3, 7, 8, 100, 4095, 4096, 4097, 12345, 1 << 20}
	for _, la := range lengths {
		for _, lb := range lengths {
			a, b := randomBytes(r, la), randomBytes(r, lb)
			want := crc32.Checksum(append(append([]byte(nil), a...), b...), castagnoli)
			got := CombineCRC32C(crc32.Checksum(a, castagnoli), crc32.Checksum(b, castagnoli), int64(lb))
			if got != want {
				t.Fatalf("len(a)=%d len(b)=%d: combined %08x, whole %08x", la, lb, got, want)
			}
		}
	}
}

// TestJoinBlockCRCs checksums random data block by block, as the GPU
// kernel does, and joins the blocks on the host.
func TestJoinBlockCRCs(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 4095, 4096, 4097, 3*4096 + 17, 4 << 20, 4<<20 - 1} {
		data := randomBytes(r, n)
		var blocks []uint32
		for off := 0; off < n; off += CRCBlockSize {
			blocks = append(blocks, crc32.Checksum(data[off:min(off+CRCBlockSize, n)], castagnoli))
		}
		if got, want := JoinBlockCRCs(blocks, int64(n)), crc32.Checksum(data, castagnoli); got != want {
			t.Errorf("%d bytes: joined %08x, whole %08x", n, got, want)
		}
	}
}

func BenchmarkJoin4MiB(b *testing.B) {
	blocks := make([]uint32, (4<<20)/CRCBlockSize)
	for i := 0; i < b.N; i++ {
		JoinBlockCRCs(blocks, 4<<20)
	}
}
