package agentapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"
)

// Paths of the backup calls. All of them need the Control token.
const (
	// PathBackups: POST starts a base backup (BackupRequest); GET PathBackups+"/{id}"
	// reports one (BackupStatus).
	PathBackups = "/backups"
	// PathRetention: POST deletes base backups from the store and the WAL that no
	// remaining backup needs (RetentionRequest, RetentionResult).
	PathRetention = "/retention"
)

// ErrNotFound is what a BackupInstance wraps for a backup it does not know; the server
// answers 404, and the Client's error matches it with errors.Is.
var ErrNotFound = errors.New("not found")

// Phases of a backup as the agent reports it.
const (
	BackupRunning   = "running"
	BackupCompleted = "completed"
	BackupFailed    = "failed"
)

// BackupRequest starts a base backup.
type BackupRequest struct {
	// ID names the backup in the store: base/<ID>/.
	ID string `json:"id"`
}

// BackupStatus is one base backup as the agent that takes it reports it.
type BackupStatus struct {
	ID    string `json:"id"`
	Phase string `json:"phase"`
	// Location is where the backup is stored, for people.
	Location  string     `json:"location,omitempty"`
	StartedAt time.Time  `json:"startedAt"`
	StoppedAt *time.Time `json:"stoppedAt,omitempty"`
	BeginLSN  string     `json:"beginLSN,omitempty"`
	EndLSN    string     `json:"endLSN,omitempty"`
	Timeline  int64      `json:"timeline,omitempty"`
	// SizeBytes is the stored (compressed) size.
	SizeBytes int64  `json:"sizeBytes,omitempty"`
	Error     string `json:"error,omitempty"`
}

// RetentionRequest names the base backups to delete.
type RetentionRequest struct {
	Delete []string `json:"delete"`
}

// RetentionResult says what was deleted.
type RetentionResult struct {
	// Deleted are the backups removed from the store.
	Deleted []string `json:"deleted"`
	// WALDeleted counts archived WAL files removed: those older than the oldest backup
	// left in the store.
	WALDeleted int `json:"walDeleted"`
}

// ArchiverStatus is continuous WAL archiving on a primary (pg_stat_archiver and the
// archive status directory).
type ArchiverStatus struct {
	// Enabled is whether a backup store is configured.
	Enabled         bool       `json:"enabled"`
	ArchivedCount   int64      `json:"archivedCount"`
	LastArchivedWAL string     `json:"lastArchivedWAL,omitempty"`
	LastArchivedAt  *time.Time `json:"lastArchivedAt,omitempty"`
	FailedCount     int64      `json:"failedCount"`
	LastFailedWAL   string     `json:"lastFailedWAL,omitempty"`
	LastFailedAt    *time.Time `json:"lastFailedAt,omitempty"`
	// LastError is the archive command's last error message, when the last attempt
	// failed.
	LastError string `json:"lastError,omitempty"`
	// Pending counts WAL segments waiting to be archived: they stay on the instance's
	// volume until they are.
	Pending int `json:"pending"`
	// PendingBytes is the size of the pending segments.
	PendingBytes int64 `json:"pendingBytes,omitempty"`
}

// Failing reports whether the last archiving attempt failed.
func (a *ArchiverStatus) Failing() bool {
	return a != nil && a.LastFailedAt != nil && (a.LastArchivedAt == nil || a.LastFailedAt.After(*a.LastArchivedAt))
}

// BackupInstance is what the server needs from an agent that takes backups.
type BackupInstance interface {
	// StartBackup starts base backup id in the background. Starting one that is running
	// or done is a no-op; starting one while another runs is a conflict.
	StartBackup(ctx context.Context, id string) error
	// Backup reports backup id; an unknown id wraps ErrNotFound.
	Backup(ctx context.Context, id string) (BackupStatus, error)
	// Retention deletes base backups and the WAL only they needed.
	Retention(ctx context.Context, req RetentionRequest) (RetentionResult, error)
}

func (s *Server) registerBackups(mux *http.ServeMux, b BackupInstance) {
	mux.Handle("POST "+PathBackups, s.bounded(s.requestTimeout, s.authorized("backup", func(w http.ResponseWriter, r *http.Request) error {
		var req BackupRequest
		if err := decodeBody(r, &req); err != nil || req.ID == "" {
			writeJSONError(w, http.StatusBadRequest, "the body must be {\"id\": \"<backup id>\"}")
			return nil
		}
		if err := b.StartBackup(r.Context(), req.ID); err != nil {
			return err
		}
		st, err := b.Backup(r.Context(), req.ID)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusAccepted, st)
		return nil
	})))
	mux.Handle("GET "+PathBackups+"/{id}", s.bounded(s.requestTimeout, s.authorized("", func(w http.ResponseWriter, r *http.Request) error {
		st, err := b.Backup(r.Context(), r.PathValue("id"))
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, st)
		return nil
	})))
	mux.Handle("POST "+PathRetention, s.bounded(s.actionTimeout, s.authorized("retention", func(w http.ResponseWriter, r *http.Request) error {
		var req RetentionRequest
		if err := decodeBody(r, &req); err != nil {
			writeJSONError(w, http.StatusBadRequest, "the body must be {\"delete\": [\"<backup id>\", ...]}")
			return nil
		}
		res, err := b.Retention(r.Context(), req)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, res)
		return nil
	})))
}

// authorized serves a call that needs the token; a non-empty name logs the call.
func (s *Server) authorized(name string, h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		log := s.log.WithValues("action", name, "remoteAddr", r.RemoteAddr)
		if code, reason := s.authorize(r, Control); code != http.StatusOK {
			s.refuse(w, r, log, code, reason)
			return
		}
		err := h(w, r)
		switch {
		case err == nil:
			if name != "" {
				log.Info("Performed action", "result", "ok", "duration", time.Since(start))
			}
		case errors.Is(err, ErrNotFound):
			writeJSONError(w, http.StatusNotFound, err.Error())
		case errors.Is(err, ErrConflict):
			log.Info("Refused action in the instance's current state", "result", "conflict", "reason", err.Error())
			writeJSONError(w, http.StatusConflict, err.Error())
		default:
			log.Error(err, "Failed action", "result", "error", "duration", time.Since(start))
			writeJSONError(w, http.StatusInternalServerError, err.Error())
		}
	})
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// StartBackup asks the agent to start base backup id.
func (c *Client) StartBackup(ctx context.Context, id string) (BackupStatus, error) {
	var st BackupStatus
	err := c.do(ctx, http.MethodPost, c.base+PathBackups, BackupRequest{ID: id}, &st, c.statusTimeout)
	return st, err
}

// Backup reports base backup id; an id the agent does not know matches ErrNotFound.
func (c *Client) Backup(ctx context.Context, id string) (BackupStatus, error) {
	var st BackupStatus
	err := c.do(ctx, http.MethodGet, c.base+PathBackups+"/"+id, nil, &st, c.statusTimeout)
	return st, err
}

// Retention asks the agent to delete base backups and the WAL only they needed.
func (c *Client) Retention(ctx context.Context, req RetentionRequest) (RetentionResult, error) {
	var res RetentionResult
	err := c.do(ctx, http.MethodPost, c.base+PathRetention, req, &res, c.actionTimeout)
	return res, err
}
