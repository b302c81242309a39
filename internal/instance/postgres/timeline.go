package postgres

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
)

// Timeline IDs (docs/failover.md, "Timeline IDs"). PostgreSQL names a promoted
// server's new timeline one above the newest it can find a history file for, in its
// own pg_wal (and its archive, which a cluster need not have). Two promotions that
// never saw each other's history files therefore choose the same ID: a standby killed
// while it was promoted and started again as primary chose 21, and the standby
// promoted in its place, which had never seen that 00000015.history, chose 21 too
// (make chaos, back-to-back). pg_rewind then takes the two for one history ("same
// timeline, no rewind required"), and the former primary follows WAL that is not a
// continuation of its own.
//
// So the primary Lease reserves the ID of each term's promotion, above every one in
// use, and the promoting agent makes PostgreSQL choose it: it places a placeholder
// history file for every missing ID below the reserved one, since PostgreSQL only
// checks that a history file exists.
//
// A placeholder holds only a comment. PostgreSQL reads it as a timeline that is no
// child of the one the standby replays, so a running standby's search for a newer
// timeline passes over it ("new timeline is not a child", a LOG line) and the
// promotion branches from the timeline really replayed. A start whose newest history
// file were a placeholder would refuse to recover ("requested timeline is not a child
// of this server's history"): placeholders with no real history file above them are
// removed before every start (Postgres.RemoveUnusedPlaceholders).

// placeholderMark begins every placeholder history file.
const placeholderMark = "# pgpilot: timeline reserved"

var historyName = regexp.MustCompile(`^([0-9A-F]{8})\.history$`)

// Histories are the history files of pg_wal by timeline ID, each true when it is a
// placeholder.
type Histories map[int64]bool

// HistoryFiles lists pg_wal's history files.
func (p *Postgres) HistoryFiles() (Histories, error) {
	dir := filepath.Join(p.PGData, "pg_wal")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	h := Histories{}
	for _, e := range entries {
		m := historyName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		id, err := strconv.ParseInt(m[1], 16, 64)
		if err != nil {
			continue
		}
		h[id] = isPlaceholder(filepath.Join(dir, e.Name()))
	}
	return h, nil
}

// NewestReal is the highest timeline ID of a real history file (1 when there is none).
func (h Histories) NewestReal() int64 {
	newest := int64(1)
	for id, placeholder := range h {
		if !placeholder {
			newest = max(newest, id)
		}
	}
	return newest
}

// isPlaceholder reports whether the history file at path is a placeholder.
func isPlaceholder(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, len(placeholderMark))
	n, _ := f.Read(head)
	return bytes.Equal(head[:n], []byte(placeholderMark))
}

// IsPlaceholderHistory reports whether the WAL file at path is a placeholder history
// file: the archiver never stores one.
func IsPlaceholderHistory(path string) bool {
	return historyName.MatchString(filepath.Base(path)) && isPlaceholder(path)
}

// HistoryPath is the path of timeline id's history file in pgdata's pg_wal.
func HistoryPath(pgdata string, id int64) string {
	return filepath.Join(pgdata, "pg_wal", fmt.Sprintf("%08X.history", id))
}

// ReserveTimelines places a placeholder history file for every ID after from and
// before next that has none in h (pg_wal's history files), so that a promotion
// recovering on timeline from or later chooses next.
func (p *Postgres) ReserveTimelines(h Histories, from, next int64) error {
	for id := max(from+1, 2); id < next; id++ {
		if _, ok := h[id]; ok {
			continue
		}
		body := fmt.Sprintf("%s for another promotion of this cluster; this instance never ran on timeline %d\n", placeholderMark, id)
		if err := writeFileDurable(HistoryPath(p.PGData, id), []byte(body), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// RemoveUnusedPlaceholders removes the placeholders above the newest real history
// file: no promotion used them, and a start would find one as the newest timeline.
func (p *Postgres) RemoveUnusedPlaceholders() error {
	h, err := p.HistoryFiles()
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	newest := h.NewestReal()
	for id, placeholder := range h {
		if placeholder && id > newest {
			if err := os.Remove(HistoryPath(p.PGData, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}
