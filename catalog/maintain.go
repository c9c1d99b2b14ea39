package catalog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/uuid"
	bolt "go.etcd.io/bbolt"
)

// Remove deletes a complete checkpoint. The index marks it deleting first,
// then its directory moves to trash/ (one rename, so no half-deleted
// checkpoint is ever under checkpoints/), then the files go, then the
// record. gc finishes a removal that a crash interrupted.
func (s *Store) removeOne(id string) error {
	var rec Record
	err := s.update(func(tx *bolt.Tx) error {
		r, ok, err := getRecordTx(tx, id)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		r.Status = StatusDeleting
		rec = r
		return putRecordTx(tx, r)
	})
	if err != nil {
		return err
	}
	crashPoint("remove-marked")
	if err := s.discard(id); err != nil {
		return err
	}
	crashPoint("remove-discarded")
	return s.update(func(tx *bolt.Tx) error { return deleteRecordTx(tx, rec) })
}

// discard moves a checkpoint directory to trash/ and deletes it there,
// following no link (removeIn).
func (s *Store) discard(id string) error {
	if _, err := uuid.Parse(id); err != nil {
		return fmt.Errorf("%w: %q is not a checkpoint ID", ErrNotFound, id)
	}
	if err := s.checkStructure(checkpointsDir, trashDir); err != nil {
		return err
	}
	trash := s.path(trashDir, id)
	if err := os.Rename(s.CheckpointDir(id), trash); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove checkpoint %s: %w", id, err)
	}
	if err := syncDir(s.path(checkpointsDir)); err != nil {
		return err
	}
	return s.removeIn(trashDir, id)
}

// Prune removes all but the keep newest complete checkpoints of job (by
// step, then creation time) and returns what it removed.
func (s *Store) Prune(job string, keep int) ([]Record, error) {
	if keep < 0 {
		return nil, fmt.Errorf("%w: --keep-last must be 0 or more, not %d", ErrInvalid, keep)
	}
	recs, err := s.List(Filter{Job: job})
	if err != nil {
		return nil, err
	}
	sortNewestFirst(recs)
	var removed []Record
	for i := keep; i < len(recs); i++ {
		if err := s.Remove(recs[i].ID); err != nil {
			return removed, err
		}
		removed = append(removed, recs[i])
	}
	return removed, nil
}

// GCReport says what GC did.
type GCReport struct {
	StagingRemoved []string `json:"staging_removed"` // abandoned partial checkpoints removed
	StagingBusy    []string `json:"staging_busy"`    // partial checkpoints still being written
	TrashRemoved   []string `json:"trash_removed"`   // leftovers of interrupted removals
	ScratchRemoved []string `json:"scratch_removed"` // this store's scratch directories of killed processes
	OutsideRemoved []string `json:"outside_removed"` // directories killed loads left beside their target
	RemovalsDone   []string `json:"removals_done"`   // interrupted removals finished
	Indexed        []string `json:"indexed"`         // complete checkpoints missing from the index, added
	Lost           []string `json:"lost"`            // index records without a checkpoint directory, dropped
	Damaged        []string `json:"damaged"`         // checkpoint directories with an unreadable manifest, left alone
	PartsRemoved   []string `json:"parts_removed"`   // parts of job checkpoints never completed (job.go)
	BytesReclaimed int64    `json:"bytes_reclaimed"`
}

// GC removes what crashed or killed writers left behind, finishes
// interrupted removals and brings the index in line with the checkpoints on
// disk. A staging directory whose writer still holds its lock is left alone.
func (s *Store) GC() (GCReport, error) {
	var rep GCReport
	staged, err := readStructureDir(s, stagingDir)
	if err != nil {
		return rep, err
	}
	for _, e := range staged {
		name := e.Name()
		if strings.HasSuffix(name, lockSuffix) {
			continue
		}
		dir := s.path(stagingDir, name)
		lock, err := lockFile(dir+lockSuffix, false)
		if err != nil {
			return rep, err
		}
		if lock == nil {
			rep.StagingBusy = append(rep.StagingBusy, name)
			continue
		}
		rep.BytesReclaimed += s.usageIn(stagingDir, name)
		rmErr := s.removeIn(stagingDir, name)
		os.Remove(dir + lockSuffix)
		lock.Close()
		if rmErr != nil {
			return rep, rmErr
		}
		rep.StagingRemoved = append(rep.StagingRemoved, name)
	}
	// Lock files whose directory is gone (a writer died between the two).
	for _, e := range staged {
		name := e.Name()
		if !strings.HasSuffix(name, lockSuffix) {
			continue
		}
		if _, err := os.Stat(s.path(stagingDir, strings.TrimSuffix(name, lockSuffix))); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		if lock, err := lockFile(s.path(stagingDir, name), false); err == nil && lock != nil {
			os.Remove(s.path(stagingDir, name))
			lock.Close()
		}
	}

	// Interrupted removals, and records that lost their directory.
	recs, err := s.List(Filter{IncludeAll: true, Parts: true})
	if err != nil {
		return rep, err
	}
	indexed := make(map[string]bool, len(recs))
	for _, r := range recs {
		indexed[r.ID] = true
		switch {
		case r.Status == StatusDeleting:
			if err := s.discard(r.ID); err != nil {
				return rep, err
			}
			if err := s.update(func(tx *bolt.Tx) error { return deleteRecordTx(tx, r) }); err != nil {
				return rep, err
			}
			rep.RemovalsDone = append(rep.RemovalsDone, r.ID)
		default:
			if _, err := os.Stat(filepath.Join(s.CheckpointDir(r.ID), manifestName)); errors.Is(err, os.ErrNotExist) {
				if err := s.update(func(tx *bolt.Tx) error { return deleteRecordTx(tx, r) }); err != nil {
					return rep, err
				}
				rep.Lost = append(rep.Lost, r.ID)
			}
		}
	}

	trash, err := readStructureDir(s, trashDir)
	if err != nil {
		return rep, err
	}
	for _, e := range trash {
		rep.BytesReclaimed += s.usageIn(trashDir, e.Name())
		if err := s.removeIn(trashDir, e.Name()); err != nil {
			return rep, err
		}
		rep.TrashRemoved = append(rep.TrashRemoved, e.Name())
	}

	removed, n, err := s.gcScratch()
	rep.ScratchRemoved = append(rep.ScratchRemoved, removed...)
	rep.BytesReclaimed += n
	if err != nil {
		return rep, err
	}
	removed, n, err = s.gcOutside()
	rep.OutsideRemoved = append(rep.OutsideRemoved, removed...)
	rep.BytesReclaimed += n
	if err != nil {
		return rep, err
	}

	// Complete checkpoints the index does not know: a crash between the
	// rename and the index update. One whose writer still holds its
	// staging lock is between the two right now: its writer lists it (or
	// takes it back), not gc.
	complete, err := os.ReadDir(s.path(checkpointsDir))
	if err != nil {
		return rep, err
	}
	for _, e := range complete {
		id := e.Name()
		if indexed[id] {
			continue
		}
		unlock, held, err := s.tryStagingLock(id)
		if err != nil {
			return rep, err
		}
		if held {
			rep.StagingBusy = append(rep.StagingBusy, id)
			continue
		}
		m, err := s.ReadManifest(id)
		switch {
		case errors.Is(err, os.ErrNotExist):
			// Its writer took it back before letting go of the lock.
		case err != nil:
			rep.Damaged = append(rep.Damaged, id)
		default:
			if err := s.putRecord(recordOf(m)); err != nil {
				unlock()
				return rep, err
			}
			rep.Indexed = append(rep.Indexed, id)
		}
		unlock()
	}
	return rep, s.gcParts(&rep)
}

// Unindexed returns the IDs of the checkpoint directories that the index
// does not list, leaving out those whose writer holds its staging lock
// (it lists them itself in a moment). A crash between a commit's rename
// and its listing leaves one (gc lists it); so may damage to the index
// that bbolt did not notice. `stasis ls` names them, so that it never
// leaves out a complete checkpoint without saying so.
func (s *Store) Unindexed() ([]string, error) {
	entries, err := readStructureDir(s, checkpointsDir)
	if err != nil {
		return nil, err
	}
	recs, err := s.List(Filter{IncludeAll: true})
	if err != nil {
		return nil, err
	}
	listed := make(map[string]bool, len(recs))
	for _, r := range recs {
		listed[r.ID] = true
	}
	var out []string
	for _, e := range entries {
		if listed[e.Name()] {
			continue
		}
		if _, err := uuid.Parse(e.Name()); err != nil {
			continue
		}
		if _, err := os.Lstat(filepath.Join(s.CheckpointDir(e.Name()), manifestName)); err != nil {
			continue
		}
		unlock, held, err := s.tryStagingLock(e.Name())
		if err != nil {
			return nil, err
		}
		if held {
			continue
		}
		unlock()
		out = append(out, e.Name())
	}
	return out, nil
}

// tryStagingLock takes staging/<id>.lock without waiting. held is true
// when a writer holds it; otherwise unlock removes the lock file and lets
// go of it.
func (s *Store) tryStagingLock(id string) (unlock func(), held bool, err error) {
	path := s.path(stagingDir, id) + lockSuffix
	lock, err := lockFile(path, false)
	if err != nil {
		return nil, false, err
	}
	if lock == nil {
		return nil, true, nil
	}
	return func() { os.Remove(path); lock.Close() }, false, nil
}

// diskUsage adds up the sizes of the regular files under dir.
func diskUsage(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
