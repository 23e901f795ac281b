use super::*;

fn t(name: &str, dtype: &str, shape: &[usize], len: u64) -> TensorHeader {
    TensorHeader {
        name: name.into(),
        dtype: dtype.into(),
        shape: shape.to_vec(),
        len,
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("larder-st-write-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn sorted_headers_print_as_a_serde_json_map() {
    let list = [t("b.weight", "BF16", &[2, 3], 12), t("a.bias", "F32", &[3], 12)];
    let h = Header::new(&list, &[("format", "pt"), ("written_by", "larder pack")], KeyOrder::Sorted).unwrap();
    let want = br#"{"__metadata__":{"format":"pt","written_by":"larder pack"},"a.bias":{"data_offsets":[12,24],"dtype":"F32","shape":[3]},"b.weight":{"data_offsets":[0,12],"dtype":"BF16","shape":[2,3]}}"#;
    assert_eq!(h.json().len() % 8, 0);
    assert_eq!(h.json().trim_ascii_end(), want);
    assert_eq!(h.file_len(), 8 + h.json().len() as u64 + 24);
}

#[test]
fn as_given_headers_print_as_python_json() {
    let list = [t("z\u{e9}\"\u{1}", "F32", &[], 4), t("a", "F32", &[1, 1], 4)];
    let h = Header::new(&list, &[("format", "pt")], KeyOrder::AsGiven).unwrap();
    let want = br#"{"z\u00e9\"\u0001":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1,1],"data_offsets":[4,8]},"__metadata__":{"format":"pt"}}"#;
    assert_eq!(h.json().trim_ascii_end(), want);
    assert_eq!(h.json().len() % 8, 0);
}

#[test]
fn data_streams_in_pieces_under_a_partial_name_then_commits() {
    let dir = scratch("ok");
    let path = dir.join("x.safetensors");
    let h = Header::new(
        &[t("a", "U8", &[3], 3), t("e", "U8", &[0], 0), t("b", "U8", &[2], 2)],
        &[],
        KeyOrder::Sorted,
    )
    .unwrap();
    let mut w = SafetensorsWriter::create(&path, &h).unwrap();
    w.write(&[1, 2]).unwrap();
    w.write(&[3, 4]).unwrap();
    w.write(&[5]).unwrap();
    let done = w.finish().unwrap();
    assert!(done.partial().ends_with("x.safetensors.partial") && !path.exists());
    assert_eq!(done.commit().unwrap(), path);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len() as u64, h.file_len());
    assert_eq!(&bytes[..8], &(h.json().len() as u64).to_le_bytes());
    assert_eq!(&bytes[h.data_start() as usize..], &[1, 2, 3, 4, 5]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn short_or_long_data_is_refused_naming_the_tensor() {
    let dir = scratch("bad");
    let path = dir.join("x.safetensors");
    let h = Header::new(&[t("a", "U8", &[3], 3), t("b", "U8", &[2], 2)], &[], KeyOrder::Sorted).unwrap();
    let mut w = SafetensorsWriter::create(&path, &h).unwrap();
    w.write(&[1, 2, 3, 4]).unwrap();
    let err = w.finish().unwrap_err().to_string();
    assert!(err.contains("tensor `b`: 1 of 2 bytes written"), "{err}");
    let mut w = SafetensorsWriter::create(&path, &h).unwrap();
    let err = w.write(&[0; 6]).unwrap_err().to_string();
    assert!(
        err.contains("x.safetensors.partial") && err.contains("1 bytes past the end"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
