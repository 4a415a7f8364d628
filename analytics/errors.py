"""Errors of the analytics jobs.

AnalyticsError
├── ArchiveMismatch   counts of a run disagree (read vs MongoDB, or written vs archive):
│                     nothing was marked archived
└── NotInArchive      no archive there, or (trace) no archived message matches
"""

from __future__ import annotations


class AnalyticsError(Exception):
    pass


class ArchiveMismatch(AnalyticsError):
    pass


class NotInArchive(AnalyticsError):
    pass
