package checkpoint

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkHasher measures what recording the files a process maps costs
// (docs/benchmarks.md): hashing a 256 MiB library the first time (from
// the page cache), finding its hash in the cache afterwards, and listing
// what this test process maps and uses, as a checkpoint does while the
// tree is frozen.
//
//	go test -run '^$' -bench Hasher -benchtime 5x ./checkpoint
func BenchmarkHasher(b *testing.B) {
	lib := filepath.Join(b.TempDir(), "libbig.so")
	data := make([]byte, 256<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := os.WriteFile(lib, data, 0o644); err != nil {
		b.Fatal(err)
	}
	b.Run("first", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := NewHasher(b.TempDir()).File(lib); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		h := NewHasher(b.TempDir())
		h.File(lib)
		for b.Loop() {
			if _, err := h.File(lib); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("frozen-scan", func(b *testing.B) {
		tree, err := Tree(os.Getpid())
		if err != nil {
			b.Fatal(err)
		}
		h := NewHasher(b.TempDir())
		paths, _, _ := usedFiles(tree[:1])
		h.Describe(paths)
		for b.Loop() {
			paths, _, _ := usedFiles(tree[:1])
			h.Describe(paths)
		}
	})
}
