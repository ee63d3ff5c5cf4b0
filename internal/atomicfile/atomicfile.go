package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile durably replaces path with data. When it returns nil, the new
// contents are on stable storage.
func WriteFile(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("atomicfile: create temp for %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return errors.Join(fmt.Errorf("atomicfile: write %s: %w", tmp, err), f.Close())
	}
	if err := f.Chmod(perm); err != nil {
		return errors.Join(fmt.Errorf("atomicfile: chmod %s: %w", tmp, err), f.Close())
	}
	if err := f.Sync(); err != nil {
		return errors.Join(fmt.Errorf("atomicfile: fsync %s: %w", tmp, err), f.Close())
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("atomicfile: close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("atomicfile: rename %s: %w", path, err)
	}
	return SyncDir(dir)
}

// SyncDir fsyncs a directory so that entries created, renamed or removed in
// it are durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("atomicfile: open dir %s: %w", dir, err)
	}
	if err := d.Sync(); err != nil {
		return errors.Join(fmt.Errorf("atomicfile: fsync dir %s: %w", dir, err), d.Close())
	}
	return d.Close()
}

// RemoveTemps removes temporary files a crashed WriteFile of path may have
// left beside it. Call it when opening the directory.
func RemoveTemps(path string) error {
	matches, err := filepath.Glob(filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*"))
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	var errs []error
	for _, m := range matches {
		errs = append(errs, os.Remove(m))
	}
	return errors.Join(errs...)
}
