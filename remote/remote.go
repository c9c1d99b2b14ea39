// Package remote keeps checkpoints of a local store on a backend (an
// object store) and brings them back: the tiered use of docs/format.md's
// "Object stores". The layout on the backend, under its prefix:
//
//	checkpoints/<id>/<data file>   each data file's bytes as stored locally
//	checkpoints/<id>/manifest      the manifest, byte for byte: written last
//
// A checkpoint is on the remote exactly when its manifest object is
// there: Push writes every data file first and the manifest last, never
// over another manifest; Pull reads the manifest and verifies every
// chunk as an import does before the checkpoint is listed locally. A job
// checkpoint's parts go (and come) first, its job manifest last.
package remote

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/stasis-ckpt/stasis/backend"
	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/gdswriter"
)

// ErrConflict: the remote holds another manifest under a checkpoint's ID
// than the local store does (which no stasis writes: IDs are random
// UUIDs); nothing is overwritten.
var ErrConflict = errors.New("the remote holds another checkpoint under this ID")

const (
	checkpointsPrefix = "checkpoints/"
	manifestName      = "manifest"
	// metaManifest, on each data object, is the SHA-256 of the manifest
	// whose data file it is: with the object's size it tells a retry
	// whether an object already there is the one to upload.
	metaManifest = "stasis-manifest-sha256"
)

func objectKey(id, name string) string { return checkpointsPrefix + id + "/" + name }

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Options for Push and Pull.
type Options struct {
	// Total, when set, is called once a pull has read the manifest, with
	// the stored bytes to come (to size a progress bar).
	Total func(storedBytes int64)
	// Progress, when set, is called with stored byte counts as they move.
	Progress func(storedBytes int64)
}

// PushResult says what a push did.
type PushResult struct {
	ID       string  `json:"id"`
	Job      string  `json:"job"`
	Step     int64   `json:"step"`
	Kind     string  `json:"kind"`
	Remote   string  `json:"remote"`
	Uploaded int64   `json:"uploaded_bytes"`      // bytes sent now
	Skipped  int64   `json:"already_there_bytes"` // bytes found on the remote already
	Already  bool    `json:"already_there"`       // the manifest was there: nothing to do
	Seconds  float64 `json:"seconds"`
}

// Push uploads complete checkpoint id of s to b: each data file (read
// back checked, extent by extent, as an export does), then the manifest.
// A data object already there with the manifest's hash and the right size
// is not sent again; a manifest already there ends the push if it is the
// same, and fails it with ErrConflict if not. For a job checkpoint, each
// part is pushed so first, then the job manifest.
func Push(ctx context.Context, s *catalog.Store, b backend.Backend, id string, o Options) (*PushResult, error) {
	start := time.Now()
	m, data, err := s.ManifestFile(id)
	if err != nil {
		return nil, err
	}
	if err := b.Check(ctx); err != nil {
		return nil, err
	}
	res := &PushResult{ID: m.ID, Job: m.Job, Step: m.Step, Kind: string(m.Kind), Remote: b.Location()}
	if m.Kind == catalog.KindJob {
		_, jm, err := s.JobParts(id)
		if err != nil {
			return nil, err
		}
		for _, p := range jm.Parts {
			pr, err := pushOne(ctx, s, b, p.ID, o)
			if err != nil {
				return nil, fmt.Errorf("job checkpoint %s: rank %d's part: %w", id, p.Rank, err)
			}
			res.Uploaded += pr.Uploaded
			res.Skipped += pr.Skipped
		}
	}
	r, err := pushManifestLast(ctx, s, b, m, data, o)
	if err != nil {
		return nil, err
	}
	res.Uploaded += r.Uploaded
	res.Skipped += r.Skipped
	res.Already = r.Already
	res.Seconds = time.Since(start).Seconds()
	return res, nil
}

func pushOne(ctx context.Context, s *catalog.Store, b backend.Backend, id string, o Options) (*PushResult, error) {
	m, data, err := s.ManifestFile(id)
	if err != nil {
		return nil, err
	}
	return pushManifestLast(ctx, s, b, m, data, o)
}

// pushManifestLast uploads m's data files that the remote lacks (or
// holds otherwise: another size, or not marked as this manifest's), then
// its manifest (data), unless that is there already.
func pushManifestLast(ctx context.Context, s *catalog.Store, b backend.Backend, m *catalog.Manifest, data []byte, o Options) (*PushResult, error) {
	res := &PushResult{}
	mkey := objectKey(m.ID, manifestName)
	there, err := sameManifest(ctx, b, mkey, data)
	if err != nil {
		return nil, err
	}
	sum := sha256Hex(data)
	for _, f := range m.Files {
		key := objectKey(m.ID, f.Name)
		if obj, err := b.Stat(ctx, key); err == nil && obj.Size == f.Size && obj.Meta[metaManifest] == sum {
			res.Skipped += f.Size
			if o.Progress != nil {
				o.Progress(f.Size)
			}
			continue
		} else if err != nil && !errors.Is(err, backend.ErrNotExist) {
			return nil, err
		}
		r, err := s.OpenChecked(m, f)
		if err != nil {
			return nil, err
		}
		// The crash tests stop a push part-way into a multipart upload
		// (past its first part).
		pr := &progressReader{r: r, fn: o.Progress, at: 2 * partHint, point: "push-mid-data"}
		err = b.Save(ctx, key, pr, f.Size, map[string]string{metaManifest: sum}, false)
		r.Close()
		if err != nil {
			return nil, err
		}
		res.Uploaded += f.Size
	}
	if there {
		res.Already = res.Uploaded == 0
		res.Skipped += int64(len(data))
		return res, nil
	}
	catalog.CrashPoint("push-before-manifest")
	err = b.Save(ctx, mkey, bytes.NewReader(data), int64(len(data)), nil, true)
	if errors.Is(err, backend.ErrExists) {
		// Another push of the same checkpoint won the race.
		if same, serr := sameManifest(ctx, b, mkey, data); serr != nil || !same {
			return nil, conflict(b, m.ID, serr)
		}
		return res, nil
	}
	if err != nil {
		return nil, err
	}
	res.Uploaded += int64(len(data))
	return res, nil
}

// partHint is about the part size of an S3 multipart upload (backend/s3).
const partHint = 16 << 20

func conflict(b backend.Backend, id string, err error) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: %s/%s: its manifest there differs from this store's; nothing was overwritten", ErrConflict, b.Location(), objectKey(id, manifestName))
}

// sameManifest says whether key holds exactly data; false when there is
// no object; ErrConflict when another manifest is there.
func sameManifest(ctx context.Context, b backend.Backend, key string, data []byte) (bool, error) {
	there, err := readAll(ctx, b, key, int64(catalog.MaxManifestSize))
	if errors.Is(err, backend.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !bytes.Equal(there, data) {
		return false, conflict(b, path.Base(path.Dir(key)), nil)
	}
	return true, nil
}

func readAll(ctx context.Context, b backend.Backend, key string, limit int64) ([]byte, error) {
	rc, err := b.Load(ctx, key, 0, -1)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%w: %s is larger than the %d bytes a manifest may have", catalog.ErrBadManifest, key, limit)
	}
	return data, nil
}

// progressReader reports what is read through it, and passes the crash
// point point (catalog.CrashPoint) once at bytes into the stream.
type progressReader struct {
	r     io.Reader
	fn    func(int64)
	at    int64
	point string
	n     int64
}

func (p *progressReader) Read(b []byte) (int, error) {
	if p.point != "" && p.n >= p.at {
		catalog.CrashPoint(p.point)
		p.point = ""
	}
	n, err := p.r.Read(b)
	p.n += int64(n)
	if p.fn != nil && n > 0 {
		p.fn(int64(n))
	}
	return n, err
}

// PullResult says what a pull did.
type PullResult struct {
	catalog.Record
	Remote     string  `json:"remote"`
	Downloaded int64   `json:"downloaded_bytes"`
	Already    bool    `json:"already_here"` // it was in the store already: nothing to do
	Seconds    float64 `json:"seconds"`
}

// Pull brings checkpoint id from b into s: the manifest object first
// (its hash checked), then each data file, written into the store's
// staging area while every chunk is verified (stored CRC, decoding,
// decoded CRC), and the checkpoint is listed only once all of it passed
// (catalog.BeginImport, the path `stasis import` takes). For a job
// checkpoint, each part first (their manifests must be the ones the job
// manifest names), then the job manifest. A checkpoint already here with
// the same manifest is left as it is.
func Pull(ctx context.Context, s *catalog.Store, b backend.Backend, id string, o Options) (*PullResult, error) {
	start := time.Now()
	if _, err := uuid.Parse(id); err != nil || len(id) != 36 {
		return nil, fmt.Errorf("%w: %q is not a checkpoint ID", catalog.ErrNotFound, id)
	}
	if err := b.Check(ctx); err != nil {
		return nil, err
	}
	data, m, err := remoteManifest(ctx, b, id)
	if err != nil {
		return nil, err
	}
	res := &PullResult{Remote: b.Location()}
	if o.Total != nil {
		o.Total(catalog.RecordOf(m).StoredBytes)
	}
	if m.Kind == catalog.KindJob {
		jm, err := catalog.ReadJobMeta(m)
		if err != nil {
			return nil, err
		}
		for _, p := range jm.Parts {
			pr, err := pullOne(ctx, s, b, p.ID, p.ManifestSHA256, o)
			if err != nil {
				return nil, fmt.Errorf("job checkpoint %s: rank %d's part: %w", id, p.Rank, err)
			}
			res.Downloaded += pr.Downloaded
		}
	}
	r, err := importRemote(ctx, s, b, m, data, o)
	if err != nil {
		return nil, err
	}
	res.Record, res.Already = r.Record, r.Already
	res.Downloaded += r.Downloaded
	res.Seconds = time.Since(start).Seconds()
	return res, nil
}

// remoteManifest reads and checks checkpoint id's manifest object.
func remoteManifest(ctx context.Context, b backend.Backend, id string) ([]byte, *catalog.Manifest, error) {
	key := objectKey(id, manifestName)
	data, err := readAll(ctx, b, key, int64(catalog.MaxManifestSize))
	if errors.Is(err, backend.ErrNotExist) {
		return nil, nil, fmt.Errorf("%w: %s is not on %s (no %s object: never pushed, or its push did not finish)", catalog.ErrNotFound, id, b.Location(), key)
	}
	if err != nil {
		return nil, nil, err
	}
	m, err := catalog.ParseManifest(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s/%s: %w", b.Location(), key, err)
	}
	if m.ID != id {
		return nil, nil, fmt.Errorf("%w: %s/%s names checkpoint %s", catalog.ErrBadManifest, b.Location(), key, m.ID)
	}
	return data, m, nil
}

func pullOne(ctx context.Context, s *catalog.Store, b backend.Backend, id, wantSHA string, o Options) (*PullResult, error) {
	data, m, err := remoteManifest(ctx, b, id)
	if err != nil {
		return nil, err
	}
	if sha256Hex(data) != wantSHA {
		return nil, fmt.Errorf("%w: %s/%s is not the manifest its job checkpoint names", catalog.ErrBadManifest, b.Location(), objectKey(id, manifestName))
	}
	return importRemote(ctx, s, b, m, data, o)
}

// importRemote stages, verifies and commits checkpoint m (manifest data)
// from b, unless s has it already with the same manifest.
func importRemote(ctx context.Context, s *catalog.Store, b backend.Backend, m *catalog.Manifest, data []byte, o Options) (*PullResult, error) {
	res := &PullResult{}
	p, err := s.BeginImport(data)
	if errors.Is(err, catalog.ErrExists) {
		local, ldata, lerr := s.ManifestFile(m.ID)
		if lerr == nil && bytes.Equal(ldata, data) {
			if rec, gerr := s.Get(m.ID); gerr == nil {
				res.Record, res.Already = rec, true
				return res, nil
			}
			res.Record, res.Already = catalog.RecordOf(local), true
			return res, nil
		}
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	committed := false
	defer func() {
		if !committed {
			p.Abort()
		}
	}()
	for _, f := range m.Files {
		key := objectKey(m.ID, f.Name)
		where := b.Location() + "/" + key
		obj, err := b.Stat(ctx, key)
		if errors.Is(err, backend.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s is missing, though the manifest names it", gdswriter.ErrCorrupt, where)
		}
		if err != nil {
			return nil, err
		}
		if obj.Size != f.Size {
			return nil, fmt.Errorf("%w: %s holds %d bytes; the manifest says %d", gdswriter.ErrCorrupt, where, obj.Size, f.Size)
		}
		rc, err := b.Load(ctx, key, 0, -1)
		if err != nil {
			return nil, err
		}
		err = p.ImportData(ctx, &progressReader{r: rc, fn: o.Progress, at: 1 << 20, point: "pull-mid-data"}, f.Name, where, catalog.TransferOptions{})
		rc.Close()
		if err != nil {
			return nil, err
		}
		res.Downloaded += f.Size
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rec, err := p.Commit()
	committed = true
	if err != nil {
		return nil, err
	}
	res.Record = *rec
	res.Downloaded += int64(len(data))
	return res, nil
}

// Entry is a checkpoint on the remote.
type Entry struct {
	catalog.Record
	Remote string `json:"remote"`
}

// List reads the manifests of the checkpoints on b (those whose manifest
// object is there: the complete ones), each as its index record would
// be. Parts of job checkpoints are left out unless parts. A manifest
// object that does not pass its checks is reported through bad and not
// listed.
func List(ctx context.Context, b backend.Backend, parts bool, bad func(id string, err error)) ([]Entry, error) {
	if err := b.Check(ctx); err != nil {
		return nil, err
	}
	var ids []string
	err := b.List(ctx, checkpointsPrefix, func(obj backend.Object) error {
		id, name, ok := strings.Cut(strings.TrimPrefix(obj.Key, checkpointsPrefix), "/")
		if ok && name == manifestName {
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, id := range ids {
		_, m, err := remoteManifest(ctx, b, id)
		if err != nil {
			if errors.Is(err, catalog.ErrBadManifest) || errors.Is(err, catalog.ErrNotFound) {
				if bad != nil {
					bad(id, err)
				}
				continue
			}
			return nil, err
		}
		if _, part := catalog.PartOf(m.Tags); part && m.Kind == catalog.KindTensors && !parts {
			continue
		}
		out = append(out, Entry{Record: catalog.RecordOf(m), Remote: b.Location()})
	}
	return out, nil
}

// GCReport says what GC removed from the remote.
type GCReport struct {
	Remote         string   `json:"remote"`
	UploadsAborted []string `json:"uploads_aborted"` // keys of interrupted multipart uploads
	OrphansRemoved []string `json:"orphans_removed"` // checkpoint IDs whose data had no manifest
	ObjectsRemoved int      `json:"objects_removed"`
	BytesReclaimed int64    `json:"bytes_reclaimed"`
	Young          []string `json:"left_young"` // IDs without a manifest, younger than the grace: a push may be under way
}

// GC removes from b what interrupted pushes left: multipart uploads
// begun more than grace ago and never completed, and the objects of a
// checkpoint that has no manifest object once the newest of them is older
// than grace (a push under way writes its manifest last, so younger ones
// are left to it). Complete checkpoints are not touched.
func GC(ctx context.Context, b backend.Backend, grace time.Duration) (*GCReport, error) {
	rep := &GCReport{Remote: b.Location(), UploadsAborted: []string{}, OrphansRemoved: []string{}, Young: []string{}}
	if err := b.Check(ctx); err != nil {
		return nil, err
	}
	now := time.Now()
	uploads, err := b.Uploads(ctx, checkpointsPrefix)
	if err != nil {
		return nil, err
	}
	for _, u := range uploads {
		if now.Sub(u.Initiated) < grace {
			continue
		}
		if err := b.AbortUpload(ctx, u); err != nil {
			return nil, err
		}
		rep.UploadsAborted = append(rep.UploadsAborted, u.Key)
	}
	type group struct {
		objs     []backend.Object
		manifest bool
		newest   time.Time
	}
	groups := map[string]*group{}
	var order []string
	err = b.List(ctx, checkpointsPrefix, func(obj backend.Object) error {
		id, name, ok := strings.Cut(strings.TrimPrefix(obj.Key, checkpointsPrefix), "/")
		if !ok {
			return nil
		}
		g := groups[id]
		if g == nil {
			g = &group{}
			groups[id] = g
			order = append(order, id)
		}
		g.objs = append(g.objs, obj)
		g.manifest = g.manifest || name == manifestName
		if obj.Modified.After(g.newest) {
			g.newest = obj.Modified
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, id := range order {
		g := groups[id]
		if g.manifest {
			continue
		}
		if now.Sub(g.newest) < grace {
			rep.Young = append(rep.Young, id)
			continue
		}
		for _, obj := range g.objs {
			if err := b.Remove(ctx, obj.Key); err != nil {
				return nil, err
			}
			rep.ObjectsRemoved++
			rep.BytesReclaimed += obj.Size
		}
		rep.OrphansRemoved = append(rep.OrphansRemoved, id)
	}
	return rep, nil
}
