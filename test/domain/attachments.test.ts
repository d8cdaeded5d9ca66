/**
 * The attachment shapes every reader sees (spec "Attachments and what counts as a
 * message"): the public JSON of the operator API and transcripts, the agent's
 * `path`, the `messages.attachments` column an operator may edit by SQL, and the
 * fields read from what a platform reports.
 */
import { afterEach, describe, expect, it, vi } from "vitest";
import {
  attachmentJson,
  attachmentPath,
  attachmentsColumn,
  handoffAttachment,
  kindOfMime,
  parseAttachmentsColumn,
  sizeOf,
  stringOrNull,
  type StoredAttachment,
} from "../../src/domain/attachments";

const photo: StoredAttachment = {
  id: "att_1",
  kind: "image",
  mimeType: "image/jpeg",
  name: "cat.jpg",
  size: 2048,
  source: { platform: "telegram", ref: "AgAD-secret-file-id" },
};

describe("the public shape", () => {
  it("has id, kind, mime_type, name and size, and never where the bytes are", () => {
    expect(attachmentJson(photo)).toEqual({
      id: "att_1",
      kind: "image",
      mime_type: "image/jpeg",
      name: "cat.jpg",
      size: 2048,
    });
    expect(JSON.stringify(attachmentJson(photo))).not.toContain("AgAD-secret-file-id");
  });

  it("gives the agent the gateway path that serves the bytes", () => {
    expect(handoffAttachment(photo)).toEqual({ ...attachmentJson(photo), path: "/v1/attachments/att_1" });
    expect(JSON.stringify(handoffAttachment(photo))).not.toContain("AgAD-secret-file-id");
  });

  it("encodes the id in the path, so no id can point at another route", () => {
    expect(attachmentPath("a/../b?x=1#y")).toBe("/v1/attachments/a%2F..%2Fb%3Fx%3D1%23y");
  });
});

describe("the messages.attachments column", () => {
  it("is null for a message without attachments, so text-only rows store nothing more", () => {
    expect(attachmentsColumn(undefined)).toBeNull();
    expect(attachmentsColumn([])).toBeNull();
  });

  it("holds the public JSON list and reads back as it was written", () => {
    const voice: StoredAttachment = { ...photo, id: "att_2", kind: "voice", mimeType: null, name: null, size: null };
    const column = attachmentsColumn([photo, voice]);
    expect(column).not.toBeNull();
    expect(column).not.toContain("AgAD-secret-file-id");
    expect(parseAttachmentsColumn(column)).toEqual([attachmentJson(photo), attachmentJson(voice)]);
  });

  it.each([
    ["null", null],
    ["empty", ""],
    ["not JSON (edited by SQL)", "[{oops"],
    ["JSON that is not a list", '{"id":"att_1"}'],
  ])("reads a column that is %s as no attachments", (_what, column) => {
    expect(parseAttachmentsColumn(column)).toEqual([]);
  });

  afterEach(() => vi.restoreAllMocks());

  it("reads an empty or null column without a warning: it is the normal state of a text message", () => {
    const warnings: unknown[] = [];
    vi.spyOn(console, "warn").mockImplementation((line: unknown) => void warnings.push(line));
    expect(parseAttachmentsColumn("")).toEqual([]);
    expect(parseAttachmentsColumn(null)).toEqual([]);
    expect(warnings).toEqual([]);
  });

  it("tells the operator, with a warning, that a broken column is shown as none", () => {
    const warnings: string[] = [];
    vi.spyOn(console, "warn").mockImplementation((line: unknown) => void warnings.push(String(line)));
    expect(parseAttachmentsColumn("[{oops")).toEqual([]);
    expect(warnings.map((line) => JSON.parse(line))).toEqual([
      expect.objectContaining({ level: "warn", msg: "messages.attachments is not valid JSON; shown as none" }),
    ]);
  });
});

describe("fields as a platform reports them", () => {
  it.each([
    [2048, 2048],
    [0, 0],
    [-1, null],
    [1.5, null],
    [Number.MAX_SAFE_INTEGER + 1, null],
    ["2048", null],
    [undefined, null],
    [null, null],
  ])("size %s reads as %s", (value, expected) => {
    expect(sizeOf(value)).toBe(expected);
  });

  it.each([
    ["cat.jpg", "cat.jpg"],
    ["", null],
    [undefined, null],
    [42, null],
  ])("name %s reads as %s", (value, expected) => {
    expect(stringOrNull(value)).toBe(expected);
  });

  it.each([
    ["image/png", "image"],
    ["IMAGE/PNG", "image"],
    ["audio/ogg", "audio"],
    ["Audio/mpeg", "audio"],
    ["video/mp4", "video"],
    ["VIDEO/webm", "video"],
    ["application/pdf", "file"],
    ["text/plain", "file"],
    ["imagery/x", "file"],
    [null, "file"],
  ] as const)("MIME type %s is a %s", (mimeType, kind) => {
    expect(kindOfMime(mimeType)).toBe(kind);
  });
});
