package postgres

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
)

// Segments a promoted standby replayed whole but never archived.
//
// With archive_mode = always a standby archives each segment its WAL receiver closes,
// and the receiver closes a segment once it has written the segment's last byte. After
// a WAL switch (pg_switch_wal, archive_timeout) the rest of the segment is padding the
// primary still has to send; the standby's startup process does not wait for it: it
// replays the switch record and goes on to the next segment. A primary that dies while
// sending the padding leaves the standby with the segment replayed, its content whole
// (the file was created at full size), the promotion's new timeline starting after it,
// and no .ready file: the WAL receiver never wrote its end. PostgreSQL readies such a
// segment only when a checkpoint would remove it, which the replication slots can put
// off for as long as a standby lags. The old primary never archived it either (that is
// why standbys archive at all), so the archive has a hole where it belongs, and a
// restore to the latest point stops at the hole without an error, short of every
// commit after it (CI, TestWALThePrimaryCouldNotArchiveIsArchivedByTheReplica: 200 of
// 350 rows; its archive_status had no entry at all for the segment).
//
// So a primary readies, once per start or promotion, every segment of an earlier
// timeline of its history that pg_wal holds, that ends at or before the point where its
// timeline ended, and that has no archive status.

// segmentName is a WAL segment's file name: timeline, then the segment number in two
// halves (the "log" and the segment within it).
var segmentName = regexp.MustCompile(`^([0-9A-F]{8})([0-9A-F]{8})([0-9A-F]{8})$`)

// switchPoints reads the history file of timeline tl: where each of its ancestors
// ended, by timeline ID.
func (p *Postgres) switchPoints(tl int64) (map[int64]pglogrepl.LSN, error) {
	ends := map[int64]pglogrepl.LSN{}
	if tl <= 1 {
		return ends, nil
	}
	f, err := os.Open(HistoryPath(p.PGData, tl))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			return nil, fmt.Errorf("%s: a line without a switch point: %q", f.Name(), line)
		}
		parent, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", f.Name(), line, err)
		}
		end, err := pglogrepl.ParseLSN(fields[1])
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", f.Name(), line, err)
		}
		ends[parent] = end
	}
	return ends, s.Err()
}

// ReadyAncestorSegments creates archive_status/<name>.ready for every segment of an
// ancestor of timeline tl that pg_wal holds, that ends at or before the point where its
// timeline ended, and that has neither a .ready nor a .done file; it returns their
// names. A segment across a switch point is PostgreSQL's own (it archives it as
// .partial); one past it is WAL the new timeline does not continue, never archived.
func (p *Postgres) ReadyAncestorSegments(tl int64) ([]string, error) {
	ends, err := p.switchPoints(tl)
	if err != nil || len(ends) == 0 {
		return nil, err
	}
	walDir := filepath.Join(p.PGData, "pg_wal")
	entries, err := os.ReadDir(walDir)
	if err != nil {
		return nil, err
	}
	var readied []string
	for _, e := range entries {
		m := segmentName.FindStringSubmatch(e.Name())
		if m == nil || !e.Type().IsRegular() {
			continue
		}
		segTL, _ := strconv.ParseInt(m[1], 16, 64)
		end, ok := ends[segTL]
		if !ok {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // removed by a checkpoint meanwhile
		}
		size := info.Size()
		if size <= 0 || size&(size-1) != 0 {
			continue // not a whole segment
		}
		log, _ := strconv.ParseUint(m[2], 16, 64)
		seg, _ := strconv.ParseUint(m[3], 16, 64)
		segNo := log*(uint64(1)<<32/uint64(size)) + seg
		if (segNo+1)*uint64(size) > uint64(end) {
			continue
		}
		status := filepath.Join(walDir, "archive_status", e.Name())
		if exists(status+".done") || exists(status+".ready") {
			continue
		}
		if err := os.WriteFile(status+".ready", nil, 0o600); err != nil {
			return readied, err
		}
		readied = append(readied, e.Name())
	}
	return readied, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, os.ErrNotExist)
}
