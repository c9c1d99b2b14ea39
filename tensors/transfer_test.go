package tensors

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/stasis-ckpt/stasis/catalog"
)

// TestExportImportTensors moves a tensors checkpoint of host buffers to
// another store through an export stream (a pipe) and loads it there.
func TestExportImportTensors(t *testing.T) {
	a, b := mustStore(t), mustStore(t)
	w := bf16(3<<20, 11)
	ts := []Tensor{
		{Name: "model/w", DType: "bf16", Shape: []int64{1024, 3072}, Host: w, Bytes: int64(len(w))},
		{Name: "opt/m", DType: "fp32", Shape: []int64{1 << 18}, Host: randBytes(1<<20, 12), Bytes: 1 << 20},
	}
	rec, err := Save(context.Background(), a, ts, opts("moved"))
	if err != nil {
		t.Fatal(err)
	}
	r, pw := io.Pipe()
	go func() {
		_, err := a.Export(context.Background(), rec.ID, pw, catalog.TransferOptions{})
		pw.CloseWithError(err)
	}()
	got, err := b.Import(context.Background(), r, catalog.TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != rec.ID || got.Kind != catalog.KindTensors || got.Bytes != rec.Bytes {
		t.Fatalf("imported %+v, saved %+v", got, rec)
	}
	into := make([]Tensor, len(ts))
	for i, t0 := range ts {
		into[i] = t0
		into[i].Host = make([]byte, len(t0.Host))
	}
	if _, err := Load(context.Background(), b, rec.ID, into, LoadOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range ts {
		if !bytes.Equal(into[i].Host, ts[i].Host) {
			t.Errorf("%s: the imported tensor differs", ts[i].Name)
		}
	}
}
