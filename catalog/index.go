package catalog

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Status of a checkpoint in the index.
type Status string

const (
	StatusComplete Status = "complete"
	// StatusDeleting marks a checkpoint whose removal has begun; gc finishes
	// removals that a crash interrupted.
	StatusDeleting Status = "deleting"
)

// Record is what the index keeps about one checkpoint.
type Record struct {
	ID          string            `json:"id"`
	Kind        Kind              `json:"kind"`
	Job         string            `json:"job"`
	Step        int64             `json:"step"`
	Created     time.Time         `json:"created"`
	Host        string            `json:"host"`
	Bytes       int64             `json:"bytes"`
	StoredBytes int64             `json:"stored_bytes"`
	Status      Status            `json:"status"`
	Tags        map[string]string `json:"tags,omitempty"`
}

func recordOf(m *Manifest) Record {
	r := Record{
		ID: m.ID, Kind: m.Kind, Job: m.Job, Step: m.Step, Created: m.Created, Host: m.Host,
		Bytes: m.Bytes, StoredBytes: m.StoredBytes, Status: StatusComplete, Tags: m.Tags,
	}
	if m.Kind == KindJob {
		r.Bytes, r.StoredBytes = jobTotals(m) // its parts'
	}
	return r
}

var (
	bucketCheckpoints = []byte("checkpoints") // id -> Record (JSON)
	bucketJobs        = []byte("jobs")        // jobKey -> id
)

// jobKey orders a job's checkpoints by step, then creation time, then ID:
// job, 0x00, step (big-endian, sign bit flipped), created (Unix ns), id.
func jobKey(r Record) []byte {
	k := make([]byte, 0, len(r.Job)+1+16+len(r.ID))
	k = append(k, r.Job...)
	k = append(k, 0)
	k = binary.BigEndian.AppendUint64(k, uint64(r.Step)^(1<<63))
	k = binary.BigEndian.AppendUint64(k, uint64(r.Created.UnixNano())^(1<<63))
	return append(k, r.ID...)
}

// initIndex creates the index's buckets where they are missing (a new
// catalog).
func (s *Store) initIndex() error {
	return s.withIndex(false, func(db *bolt.DB) error {
		return db.Update(func(tx *bolt.Tx) error {
			for _, b := range [][]byte{bucketCheckpoints, bucketJobs} {
				if _, err := tx.CreateBucketIfNotExists(b); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

func putRecordTx(tx *bolt.Tx, r Record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := tx.Bucket(bucketCheckpoints).Put([]byte(r.ID), data); err != nil {
		return err
	}
	return tx.Bucket(bucketJobs).Put(jobKey(r), []byte(r.ID))
}

func deleteRecordTx(tx *bolt.Tx, r Record) error {
	if err := tx.Bucket(bucketJobs).Delete(jobKey(r)); err != nil {
		return err
	}
	return tx.Bucket(bucketCheckpoints).Delete([]byte(r.ID))
}

func (s *Store) putRecord(r Record) error {
	return s.update(func(tx *bolt.Tx) error { return putRecordTx(tx, r) })
}

// putNewRecord lists r unless another record with its ID exists
// (ErrExists). r itself, listed by a rebuild of the catalog from the
// manifests (r's among them), is no other record.
func (s *Store) putNewRecord(r Record) error {
	return s.update(func(tx *bolt.Tx) error {
		if got, listed, err := getRecordTx(tx, r.ID); err != nil || listed {
			if err == nil && got.Status == StatusComplete && got.Created.Equal(r.Created) && got.Job == r.Job && got.Step == r.Step {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("%w: checkpoint %s was listed in this store during the import", ErrExists, r.ID)
			}
			return err
		}
		return putRecordTx(tx, r)
	})
}

func getRecordTx(tx *bolt.Tx, id string) (Record, bool, error) {
	data := tx.Bucket(bucketCheckpoints).Get([]byte(id))
	if data == nil {
		return Record{}, false, nil
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return Record{}, false, fmt.Errorf("%w: its entry for %s does not decode: %v", ErrDamaged, id, err)
	}
	return r, true, nil
}

// Filter selects records for List.
type Filter struct {
	Job        string // "" for every job
	IncludeAll bool   // also list records whose removal is in progress
	// Parts also lists the parts of job checkpoints (job.go), which are
	// otherwise left out: they are listed through their job checkpoint.
	Parts bool
}

// List returns the checkpoints of the index, ordered by job, step and
// creation time.
func (s *Store) List(f Filter) ([]Record, error) {
	var out []Record
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketJobs).Cursor()
		var prefix []byte
		if f.Job != "" {
			prefix = append([]byte(f.Job), 0)
		}
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			r, ok, err := getRecordTx(tx, string(v))
			if err != nil {
				return err
			}
			if _, part := PartOf(r.Tags); part && r.Kind == KindTensors && !f.Parts {
				continue
			}
			if ok && (f.IncludeAll || r.Status == StatusComplete) {
				out = append(out, r)
			}
		}
		return nil
	})
	return out, err
}

// Get returns the record of the checkpoint with exactly this ID.
func (s *Store) Get(id string) (Record, error) {
	var r Record
	err := s.view(func(tx *bolt.Tx) error {
		var ok bool
		var err error
		r, ok, err = getRecordTx(tx, id)
		if err == nil && (!ok || r.Status != StatusComplete) {
			err = fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		return err
	})
	return r, err
}

// Resolve finds the one complete checkpoint whose ID starts with prefix.
func (s *Store) Resolve(prefix string) (Record, error) {
	prefix = strings.ToLower(strings.TrimSpace(prefix))
	if prefix == "" {
		return Record{}, fmt.Errorf("%w: empty checkpoint ID", ErrNotFound)
	}
	var matches []Record
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketCheckpoints).Cursor()
		for k, _ := c.Seek([]byte(prefix)); k != nil && bytes.HasPrefix(k, []byte(prefix)); k, _ = c.Next() {
			r, ok, err := getRecordTx(tx, string(k))
			if err != nil {
				return err
			}
			if ok && r.Status == StatusComplete {
				matches = append(matches, r)
			}
		}
		return nil
	})
	if err != nil {
		return Record{}, err
	}
	switch len(matches) {
	case 0:
		return Record{}, fmt.Errorf("%w: no checkpoint ID starts with %q (see `stasis ls`)", ErrNotFound, prefix)
	case 1:
		return matches[0], nil
	}
	ids := make([]string, 0, 3)
	for i, m := range matches {
		if i == 3 {
			ids = append(ids, "...")
			break
		}
		ids = append(ids, m.ID)
	}
	return Record{}, fmt.Errorf("%w: %q matches %d checkpoints (%s); give more characters", ErrAmbiguous, prefix, len(matches), strings.Join(ids, ", "))
}

// Latest returns the complete checkpoint of job with the highest step (the
// newest among equal steps).
func (s *Store) Latest(job string) (Record, error) {
	recs, err := s.List(Filter{Job: job})
	if err != nil {
		return Record{}, err
	}
	if len(recs) == 0 {
		return Record{}, fmt.Errorf("%w: job %q has no complete checkpoint", ErrNotFound, job)
	}
	return recs[len(recs)-1], nil
}

// sortNewestFirst orders records by step, then creation time, newest first.
func sortNewestFirst(recs []Record) {
	sort.SliceStable(recs, func(i, j int) bool {
		return bytes.Compare(jobKey(recs[i]), jobKey(recs[j])) > 0
	})
}
