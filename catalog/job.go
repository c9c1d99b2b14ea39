package catalog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// A job checkpoint is one checkpoint of a job of many ranks (processes,
// often on several nodes) at one step: one part per rank, each an ordinary
// tensors checkpoint committed by its own rank's process, and a job
// manifest (kind job), committed last by one rank (the coordinator) once
// every part is committed. The job manifest is the commit point: a job
// checkpoint is complete exactly when it exists, and it names each part by
// ID and by its manifest's SHA-256, so that no part can be swapped for
// another. Parts carry reserved tags naming their job checkpoint's attempt,
// rank and world size; an attempt is a key the ranks share for one run of
// the job (two runs reaching the same step never mix parts). Parts are
// not listed on their own; gc removes those no job manifest names once a
// later complete job checkpoint supersedes them or they are older than
// OrphanPartAge. The coordinator finds the parts in checkpoints/ itself
// (the manifests are the truth), so ranks on several nodes sharing the
// store's file system need no lock in common but the per-checkpoint ones.

// KindJob is a job checkpoint's manifest: no data of its own, its parts in
// meta.job.
const KindJob Kind = "job"

// Tags a part carries (reserved: the "stasis." prefix is stasis's).
const (
	TagAttempt   = "stasis.attempt"
	TagRank      = "stasis.rank"
	TagWorldSize = "stasis.world_size"
)

// MaxWorldSize bounds the ranks of a job checkpoint.
const MaxWorldSize = 1 << 16

// OrphanPartAge is how old a part no job manifest names must be before gc
// removes it while no later job checkpoint supersedes it.
const OrphanPartAge = time.Hour

var attemptPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// ErrIncomplete is returned when the parts of a job checkpoint did not all
// arrive.
var ErrIncomplete = errors.New("job checkpoint incomplete")

// PartInfo says which part of which job checkpoint a checkpoint is.
type PartInfo struct {
	Attempt   string `json:"attempt"`
	Rank      int    `json:"rank"`
	WorldSize int    `json:"world_size"`
}

// Validate checks a part's identity.
func (p PartInfo) Validate() error {
	if !attemptPattern.MatchString(p.Attempt) {
		return fmt.Errorf("%w: attempt %q: use 1 to 64 of A-Z a-z 0-9 . _ -, starting with a letter or digit", ErrInvalid, p.Attempt)
	}
	if p.WorldSize < 1 || p.WorldSize > MaxWorldSize {
		return fmt.Errorf("%w: world size %d: use 1 to %d", ErrInvalid, p.WorldSize, MaxWorldSize)
	}
	if p.Rank < 0 || p.Rank >= p.WorldSize {
		return fmt.Errorf("%w: rank %d is not in a world of %d (0 to %d)", ErrInvalid, p.Rank, p.WorldSize, p.WorldSize-1)
	}
	return nil
}

// Tags adds the part's reserved tags to tags (a new map).
func (p PartInfo) Tags(tags map[string]string) map[string]string {
	out := make(map[string]string, len(tags)+3)
	for k, v := range tags {
		out[k] = v
	}
	out[TagAttempt], out[TagRank], out[TagWorldSize] = p.Attempt, strconv.Itoa(p.Rank), strconv.Itoa(p.WorldSize)
	return out
}

// PartOf reads the part identity of a record or manifest's tags; ok is
// false for a checkpoint that is no part.
func PartOf(tags map[string]string) (p PartInfo, ok bool) {
	a, has := tags[TagAttempt]
	if !has {
		return PartInfo{}, false
	}
	r, err1 := strconv.Atoi(tags[TagRank])
	w, err2 := strconv.Atoi(tags[TagWorldSize])
	p = PartInfo{Attempt: a, Rank: r, WorldSize: w}
	return p, err1 == nil && err2 == nil && p.Validate() == nil
}

// JobMeta is what a job manifest records in meta.job.
type JobMeta struct {
	Attempt   string    `json:"attempt"`
	WorldSize int       `json:"world_size"`
	Parts     []JobPart `json:"parts"` // by rank
	// App is what the coordinator recorded for its readers (a JSON
	// value; the DCP backend's: its metadata, pickled, in base64).
	App json.RawMessage `json:"app,omitempty"`
}

// JobPart names one rank's part.
type JobPart struct {
	Rank           int    `json:"rank"`
	ID             string `json:"id"`
	Host           string `json:"host"`
	Bytes          int64  `json:"bytes"`
	StoredBytes    int64  `json:"stored_bytes"`
	ManifestSHA256 string `json:"manifest_sha256"`
}

type jobManifestMeta struct {
	Job *JobMeta `json:"job"`
}

// ReadJobMeta reads the parts of a job manifest.
func ReadJobMeta(m *Manifest) (*JobMeta, error) {
	var jm jobManifestMeta
	if m.Kind != KindJob || json.Unmarshal(m.Meta, &jm) != nil || jm.Job == nil {
		return nil, fmt.Errorf("%w: checkpoint %s is no job checkpoint", ErrBadManifest, m.ID)
	}
	return jm.Job, nil
}

// validateJobManifest checks what a job manifest adds to the rules of
// every manifest: no data of its own, and one part per rank.
func validateJobManifest(m *Manifest) error {
	if len(m.Files) > 0 || len(m.Entries) > 0 {
		return fmt.Errorf("%w: job checkpoint %s holds data of its own", ErrBadManifest, m.ID)
	}
	jm, err := ReadJobMeta(m)
	if err != nil {
		return err
	}
	if err := (PartInfo{Attempt: jm.Attempt, Rank: 0, WorldSize: jm.WorldSize}).Validate(); err != nil {
		return fmt.Errorf("%w: job checkpoint %s: %v", ErrBadManifest, m.ID, err)
	}
	if len(jm.Parts) != jm.WorldSize {
		return fmt.Errorf("%w: job checkpoint %s names %d parts for %d ranks", ErrBadManifest, m.ID, len(jm.Parts), jm.WorldSize)
	}
	for i, p := range jm.Parts {
		if p.Rank != i {
			return fmt.Errorf("%w: job checkpoint %s: part %d is of rank %d", ErrBadManifest, m.ID, i, p.Rank)
		}
		if _, err := uuid.Parse(p.ID); err != nil || len(p.ID) != 36 || len(p.ManifestSHA256) != 64 || p.Bytes < 0 || p.StoredBytes < 0 {
			return fmt.Errorf("%w: job checkpoint %s: rank %d's part is not named right", ErrBadManifest, m.ID, i)
		}
	}
	return nil
}

// jobTotals are the bytes of a job checkpoint's parts, for its record.
func jobTotals(m *Manifest) (bytes, stored int64) {
	jm, err := ReadJobMeta(m)
	if err != nil {
		return 0, 0
	}
	for _, p := range jm.Parts {
		bytes += p.Bytes
		stored += p.StoredBytes
	}
	return bytes, stored
}

// partOnDisk is a part found under checkpoints/.
type partOnDisk struct {
	m      *Manifest
	sha256 string
}

// findParts reads the manifests under checkpoints/ and returns the newest
// part of each rank of job at step in attempt; seen caches what was read
// (manifests never change).
func (s *Store) findParts(job string, step int64, attempt string, seen map[string]*partOnDisk) (map[int]*partOnDisk, error) {
	ents, err := os.ReadDir(s.path(checkpointsDir))
	if err != nil {
		return nil, err
	}
	// What the index says of a checkpoint spares reading its manifest:
	// only the parts of this job checkpoint are read (for their hashes),
	// and what the index does not list (written on another node sharing
	// the store, or not listed yet).
	recs, err := s.List(Filter{IncludeAll: true, Parts: true})
	if err != nil {
		return nil, err
	}
	indexed := make(map[string]bool, len(recs)) // ID: whether it may be a part of this job checkpoint
	for _, r := range recs {
		info, isPart := PartOf(r.Tags)
		indexed[r.ID] = isPart && r.Kind == KindTensors && r.Job == job && r.Step == step && info.Attempt == attempt
	}
	out := map[int]*partOnDisk{}
	for _, e := range ents {
		id := e.Name()
		if candidate, ok := indexed[id]; ok && !candidate {
			continue // another checkpoint, as the index says
		}
		p, ok := seen[id]
		if !ok {
			m, data, err := s.readManifestFile(id)
			if err == nil && m.Kind == KindTensors {
				if _, isPart := PartOf(m.Tags); isPart {
					sum := sha256.Sum256(data)
					p = &partOnDisk{m: m, sha256: hex.EncodeToString(sum[:])}
				}
			}
			if err == nil || !errors.Is(err, os.ErrNotExist) {
				seen[id] = p // nil: no part, or unreadable (a crash cannot make one)
			}
		}
		if p == nil || p.m.Job != job || p.m.Step != step {
			continue
		}
		info, _ := PartOf(p.m.Tags)
		if info.Attempt != attempt {
			continue
		}
		if q := out[info.Rank]; q == nil || p.m.Created.After(q.m.Created) {
			out[info.Rank] = p
		}
	}
	return out, nil
}

// CommitJob waits (up to timeout) until a part of every rank of job at
// step in attempt is committed, then commits the job checkpoint that
// names them, and returns its record. A rank that never arrives fails it
// with ErrIncomplete naming the missing ranks; nothing is listed then,
// and gc removes the parts in time. A rank with two parts in one attempt
// (a rank that was restarted) counts with its newest.
func (s *Store) CommitJob(ctx context.Context, job string, step int64, part PartInfo, timeout time.Duration, app json.RawMessage) (*Record, error) {
	if err := part.Validate(); err != nil {
		return nil, err
	}
	if len(app) > 0 && !json.Valid(app) {
		return nil, fmt.Errorf("%w: the job checkpoint's app metadata is not JSON", ErrInvalid)
	}
	deadline := time.Now().Add(timeout)
	seen := map[string]*partOnDisk{}
	var parts map[int]*partOnDisk
	for {
		var err error
		if parts, err = s.findParts(job, step, part.Attempt, seen); err != nil {
			return nil, err
		}
		var other *partOnDisk
		for _, p := range parts {
			if info, _ := PartOf(p.m.Tags); info.WorldSize != part.WorldSize {
				other = p
			}
		}
		if other != nil {
			info, _ := PartOf(other.m.Tags)
			return nil, fmt.Errorf("%w: job %s step %d attempt %s: rank %d saved its part (%s) for a world of %d ranks, this rank for %d", ErrInvalid, job, step, part.Attempt, info.Rank, other.m.ID, info.WorldSize, part.WorldSize)
		}
		if len(parts) == part.WorldSize {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: job %s step %d attempt %s: rank(s) %s did not commit their part within %s; nothing is listed", ErrIncomplete, job, step, part.Attempt, missingRanks(parts, part.WorldSize), timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	jm := JobMeta{Attempt: part.Attempt, WorldSize: part.WorldSize, App: app}
	for r := range part.WorldSize {
		p := parts[r]
		jm.Parts = append(jm.Parts, JobPart{Rank: r, ID: p.m.ID, Host: p.m.Host, Bytes: p.m.Bytes, StoredBytes: p.m.StoredBytes, ManifestSHA256: p.sha256})
	}
	meta, err := json.Marshal(jobManifestMeta{Job: &jm})
	if err != nil {
		return nil, err
	}
	pend, err := s.Begin(KindJob, job, step, map[string]string{TagAttempt: part.Attempt, TagWorldSize: strconv.Itoa(part.WorldSize)})
	if err != nil {
		return nil, err
	}
	pend.Manifest.Meta = meta
	rec, err := pend.Commit()
	if err != nil {
		pend.Abort()
		return nil, err
	}
	return rec, nil
}

func missingRanks(parts map[int]*partOnDisk, world int) string {
	var miss []int
	for r := range world {
		if parts[r] == nil {
			miss = append(miss, r)
		}
	}
	s := ""
	for i, r := range miss {
		if i == 8 {
			s += fmt.Sprintf(" and %d more", len(miss)-8)
			break
		}
		if i > 0 {
			s += ", "
		}
		s += strconv.Itoa(r)
	}
	return s
}

// JobParts reads a complete job checkpoint's parts and checks each against
// the job manifest: it must be there, listed or not, with the manifest the
// job manifest names.
func (s *Store) JobParts(id string) (*Manifest, *JobMeta, error) {
	m, err := s.ReadManifest(id)
	if err != nil {
		return nil, nil, err
	}
	jm, err := ReadJobMeta(m)
	if err != nil {
		return nil, nil, err
	}
	for _, p := range jm.Parts {
		_, data, err := s.readManifestFile(p.ID)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: job checkpoint %s: rank %d's part %s: %v", ErrBadManifest, id, p.Rank, p.ID, err)
		}
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != p.ManifestSHA256 {
			return nil, nil, fmt.Errorf("%w: job checkpoint %s: rank %d's part %s is not the one it was committed with", ErrBadManifest, id, p.Rank, p.ID)
		}
	}
	return m, jm, nil
}

// Part returns the ID of rank's part of job checkpoint id.
func (s *Store) Part(id string, rank int) (string, *JobMeta, error) {
	_, jm, err := s.JobParts(id)
	if err != nil {
		return "", nil, err
	}
	if rank < 0 || rank >= jm.WorldSize {
		return "", jm, fmt.Errorf("%w: job checkpoint %s has %d ranks (0 to %d); rank %d has no part (loading into another world size needs a resharding loader, such as DCP's)", ErrInvalid, id, jm.WorldSize, jm.WorldSize-1, rank)
	}
	return jm.Parts[rank].ID, jm, nil
}

// orphanParts lists the parts no complete job checkpoint names that gc
// may remove: superseded (a complete job checkpoint of their job at the
// same or a later step was made after them: their attempt lost or died),
// or older than OrphanPartAge. A part made after every job checkpoint of
// its step may belong to a job checkpoint still being completed.
func orphanParts(recs []Record, named map[string]bool, now time.Time) []Record {
	var jobs []Record
	for _, r := range recs {
		if r.Kind == KindJob && r.Status == StatusComplete {
			jobs = append(jobs, r)
		}
	}
	superseded := func(p Record) bool {
		for _, j := range jobs {
			if j.Job == p.Job && j.Step >= p.Step && j.Created.After(p.Created) {
				return true
			}
		}
		return false
	}
	var out []Record
	for _, r := range recs {
		if _, ok := PartOf(r.Tags); !ok || r.Kind != KindTensors || named[r.ID] || r.Status != StatusComplete {
			continue
		}
		if superseded(r) || now.Sub(r.Created) > OrphanPartAge {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Remove deletes a complete checkpoint; a job checkpoint with its parts:
// the job manifest first (so the job checkpoint is gone in one step), then
// each part. gc finishes what a crash interrupted (its parts are then
// orphans).
func (s *Store) Remove(id string) error {
	var parts []JobPart
	if r, err := s.Get(id); err == nil && r.Kind == KindJob {
		if m, err := s.ReadManifest(id); err == nil {
			if jm, err := ReadJobMeta(m); err == nil {
				parts = jm.Parts
			}
		}
	}
	if err := s.removeOne(id); err != nil {
		return err
	}
	for _, p := range parts {
		if err := s.removeOne(p.ID); err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	return nil
}

// gcParts removes the parts no complete job checkpoint names once they
// are orphans (orphanParts).
func (s *Store) gcParts(rep *GCReport) error {
	recs, err := s.List(Filter{Parts: true})
	if err != nil {
		return err
	}
	named := map[string]bool{}
	for _, r := range recs {
		if r.Kind != KindJob {
			continue
		}
		m, err := s.ReadManifest(r.ID)
		if err != nil {
			continue
		}
		if jm, err := ReadJobMeta(m); err == nil {
			for _, p := range jm.Parts {
				named[p.ID] = true
			}
		}
	}
	for _, r := range orphanParts(recs, named, time.Now()) {
		rep.BytesReclaimed += r.StoredBytes
		if err := s.removeOne(r.ID); err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		rep.PartsRemoved = append(rep.PartsRemoved, r.ID)
	}
	return nil
}
